//! The API's one error type. Every handler returns `Result<_, ApiError>`; this file is the
//! only place that turns errors into HTTP responses.

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use heddle_types::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    Timeout(&'static str, String),
    /// A result, renewal or rendezvous sent under a claim that is no longer the job's.
    #[error("{0}")]
    StaleClaim(String),
    /// Too many requests from one credential; retry after this many seconds.
    #[error("{1}")]
    RateLimited(u64, String),
    /// This replica is at a cap (e.g. concurrent long polls); another may take it.
    #[error("{0}")]
    Busy(String),
    /// Postgres cannot be reached or is restarting ([`db_unreachable`]): 503 with
    /// `Retry-After`, never 500, so clients wait instead of giving up.
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

pub use crate::db::reachability::db_unreachable;

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable"),
            ApiError::Timeout(code, _) => (StatusCode::REQUEST_TIMEOUT, code),
            ApiError::StaleClaim(_) => (StatusCode::CONFLICT, "stale_claim"),
            ApiError::RateLimited(..) => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            _ if db_unreachable(&err) => ApiError::Unavailable(err),
            sqlx::Error::RowNotFound => ApiError::NotFound("no such object".into()),
            sqlx::Error::Database(db) => match db.kind() {
                sqlx::error::ErrorKind::UniqueViolation => ApiError::Conflict(format!(
                    "already exists ({})",
                    db.constraint().unwrap_or("unique")
                )),
                sqlx::error::ErrorKind::ForeignKeyViolation => ApiError::Unprocessable(format!(
                    "refers to a missing object ({})",
                    db.constraint().unwrap_or("foreign key")
                )),
                sqlx::error::ErrorKind::CheckViolation
                | sqlx::error::ErrorKind::NotNullViolation => ApiError::Unprocessable(format!(
                    "invalid value ({})",
                    db.constraint().unwrap_or("check")
                )),
                // SQLSTATE class 22, "data exception": text Postgres cannot store (a NUL
                // byte), numbers out of range. The input is at fault, not the server.
                _ if db.code().is_some_and(|c| c.starts_with("22")) => {
                    ApiError::Unprocessable(format!("a value cannot be stored: {}", db.message()))
                }
                _ => ApiError::Internal(err.into()),
            },
            _ => ApiError::Internal(err.into()),
        }
    }
}

/// An internal error that is (or wraps, through `context`) a database error of the
/// unreachable kind still answers 503; everything else stays a 500.
impl From<anyhow::Error> for ApiError {
    fn from(err: anyhow::Error) -> Self {
        if err
            .downcast_ref::<sqlx::Error>()
            .is_some_and(db_unreachable)
        {
            match err.downcast::<sqlx::Error>() {
                Ok(db) => return ApiError::Unavailable(db),
                Err(err) => return ApiError::Internal(err),
            }
        }
        ApiError::Internal(err)
    }
}

/// A variable, value or text the environment policy refuses: the input is at fault.
impl From<heddle_types::kinds::SpecParamsError> for ApiError {
    fn from(err: heddle_types::kinds::SpecParamsError) -> Self {
        ApiError::Unprocessable(err.to_string())
    }
}

impl From<heddle_types::env_policy::EnvError> for ApiError {
    fn from(err: heddle_types::env_policy::EnvError) -> Self {
        ApiError::Unprocessable(err.to_string())
    }
}

/// A name people typed that the naming rule refuses: the input is at fault.
impl From<crate::db::InvalidName> for ApiError {
    fn from(err: crate::db::InvalidName) -> Self {
        ApiError::Unprocessable(err.to_string())
    }
}

/// A stored recommendation the env export refuses is a conflict with what is stored, which
/// an operator resolves; an unwritable node name is the request's fault.
impl From<crate::recommendations::ExportError> for ApiError {
    fn from(err: crate::recommendations::ExportError) -> Self {
        use crate::recommendations::ExportError as E;
        match err {
            E::Name(e) => e.into(),
            refused @ E::Refused { .. } => ApiError::Conflict(refused.to_string()),
        }
    }
}

impl From<crate::health::HealthError> for ApiError {
    fn from(err: crate::health::HealthError) -> Self {
        use crate::health::HealthError;
        match err {
            HealthError::NoSuchResult(id) => ApiError::NotFound(format!("no result {id}")),
            e @ HealthError::NoSuchSeries(_) => ApiError::NotFound(e.to_string()),
            HealthError::Invalid(message) => ApiError::Unprocessable(message),
            HealthError::Database(e) => e.into(),
            HealthError::Jobs(e) => e.into(),
            other @ HealthError::Decode { .. } => ApiError::Internal(other.into()),
        }
    }
}

impl From<crate::observed::ObservedError> for ApiError {
    fn from(err: crate::observed::ObservedError) -> Self {
        use crate::observed::ObservedError as E;
        match err {
            E::Invalid(m) => ApiError::Unprocessable(m),
            E::NoSuchJob(id) => ApiError::NotFound(format!("no observed job {id}")),
            E::Database(e) => e.into(),
            other @ E::Decode { .. } => ApiError::Internal(other.into()),
        }
    }
}

impl From<crate::fabric::FabricError> for ApiError {
    fn from(err: crate::fabric::FabricError) -> Self {
        use crate::fabric::FabricError as E;
        match err {
            invalid @ E::Invalid { .. } => ApiError::Unprocessable(invalid.to_string()),
            E::NoneYet => ApiError::NotFound(err.to_string()),
            E::Database(e) => e.into(),
            other @ (E::Decode(_) | E::Reader(_)) => ApiError::Internal(other.into()),
        }
    }
}

impl From<crate::db::LookupError> for ApiError {
    fn from(err: crate::db::LookupError) -> Self {
        use crate::db::LookupError as E;
        match err {
            E::NoNode(_) | E::NoSite(_) => ApiError::NotFound(err.to_string()),
            E::Db(e) => e.into(),
        }
    }
}

impl From<crate::jobs::JobError> for ApiError {
    fn from(err: crate::jobs::JobError) -> Self {
        use crate::jobs::JobError as E;
        match err {
            E::NoRun(_) | E::NoJob(_) => ApiError::NotFound(err.to_string()),
            E::Lookup(e) => e.into(),
            E::Invalid(message) => ApiError::Unprocessable(message),
            E::EnvSplit(splits) => ApiError::Unprocessable(splits.to_string()),
            E::OtherNode(_) => ApiError::Forbidden(err.to_string()),
            E::StaleClaim(message) => ApiError::StaleClaim(message),
            E::Conflict(message) => ApiError::Conflict(message),
            // The table refuses the move: the job is not in a state that allows it.
            E::Illegal(_) => ApiError::Conflict(err.to_string()),
            E::Database(e) => e.into(),
            other @ E::Corrupt { .. } => ApiError::Internal(other.into()),
        }
    }
}

impl From<crate::tokens::TokenError> for ApiError {
    fn from(err: crate::tokens::TokenError) -> Self {
        match err {
            crate::tokens::TokenError::Database(e) => e.into(),
            corrupt => ApiError::Internal(anyhow::anyhow!(corrupt)),
        }
    }
}

impl From<crate::investigate::InvestigateError> for ApiError {
    fn from(err: crate::investigate::InvestigateError) -> Self {
        use crate::investigate::InvestigateError as E;
        match err {
            E::NoSuchInvestigation(_) | E::NoSuchResult(_) | E::NoSuchNode(_) => {
                ApiError::NotFound(err.to_string())
            }
            E::Invalid(message) => ApiError::Unprocessable(message),
            E::Database(e) => e.into(),
            other @ E::Corrupt { .. } => ApiError::Internal(other.into()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let retry_after = match &self {
            ApiError::RateLimited(secs, _) => Some((*secs).max(1)),
            _ if status == StatusCode::SERVICE_UNAVAILABLE => Some(1),
            _ => None,
        };
        let message = match &self {
            ApiError::Internal(err) => {
                tracing::error!(error = ?err, "internal error");
                "internal error; see the server log".to_string()
            }
            ApiError::Unavailable(err) => {
                tracing::warn!(error = %err, "database unavailable");
                "the database is unavailable; retry later".to_string()
            }
            other => other.to_string(),
        };
        let mut response = (
            status,
            axum::Json(ErrorBody {
                error: code.to_string(),
                message,
            }),
        )
            .into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

fn rejection(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(text),
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::Unprocessable(text),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::BadRequest(text),
        _ => ApiError::BadRequest(text),
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        rejection(r.status(), r.body_text())
    }
}
impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::BadRequest(r.body_text())
    }
}
impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::BadRequest(r.body_text())
    }
}
impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        rejection(r.status(), r.body_text())
    }
}

impl From<crate::http::json::BodyRejection> for ApiError {
    fn from(r: crate::http::json::BodyRejection) -> Self {
        use crate::http::json::BodyRejection as R;
        match r {
            R::NotJson => ApiError::BadRequest(r.to_string()),
            R::TooDeep(_) => ApiError::Unprocessable(r.to_string()),
            R::Bytes(r) => r.into(),
            R::Json(r) => r.into(),
        }
    }
}
impl IntoResponse for crate::http::json::BodyRejection {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

pub use crate::http::json::Json;

#[derive(Debug, axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

#[derive(Debug, axum::extract::FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

pub type ApiResult<T> = Result<T, ApiError>;

/// For inserts of named things: a unique violation becomes a 409 that names the duplicate;
/// every other error maps as usual.
pub fn duplicate_name(what: &'static str, name: &str) -> impl FnOnce(sqlx::Error) -> ApiError {
    let name = name.to_string();
    move |e| match ApiError::from(e) {
        ApiError::Conflict(_) => {
            ApiError::Conflict(format!("a {what} named {name:?} already exists"))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::io;

    use sqlx::error::{DatabaseError, ErrorKind};

    use super::*;

    /// A database error as Postgres would report it: only the SQLSTATE and kind matter here.
    #[derive(Debug)]
    struct Pg {
        code: &'static str,
        kind: ErrorKind,
    }

    impl std::fmt::Display for Pg {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.code)
        }
    }
    impl std::error::Error for Pg {}
    impl DatabaseError for Pg {
        fn message(&self) -> &str {
            "from a test"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.code))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> ErrorKind {
            match &self.kind {
                ErrorKind::UniqueViolation => ErrorKind::UniqueViolation,
                ErrorKind::ForeignKeyViolation => ErrorKind::ForeignKeyViolation,
                ErrorKind::NotNullViolation => ErrorKind::NotNullViolation,
                ErrorKind::CheckViolation => ErrorKind::CheckViolation,
                _ => ErrorKind::Other,
            }
        }
    }

    fn pg(code: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Pg {
            code,
            kind: ErrorKind::Other,
        }))
    }

    fn status(err: impl Into<ApiError>) -> (StatusCode, Option<String>) {
        let response = err.into().into_response();
        let retry = response
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_string());
        (response.status(), retry)
    }

    #[test]
    fn an_unreachable_database_is_503_with_retry_after() {
        let unreachable = [
            sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionRefused)),
            sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionReset)),
            sqlx::Error::Io(io::Error::from(io::ErrorKind::UnexpectedEof)),
            sqlx::Error::Tls("handshake eof".into()),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            pg("57P01"), // admin_shutdown: `pg_ctl stop -m fast`
            pg("57P02"), // crash_shutdown
            pg("57P03"), // cannot_connect_now: starting up or shutting down
            pg("08000"), // connection_exception
            pg("08003"), // connection_does_not_exist
            pg("08006"), // connection_failure
            pg("08001"), // sqlclient_unable_to_establish_sqlconnection
            pg("08004"), // sqlserver_rejected_establishment_of_sqlconnection
            pg("53300"), // too_many_connections
            pg("25006"), // read_only_sql_transaction
        ];
        for err in unreachable {
            let what = format!("{err:?}");
            assert!(db_unreachable(&err), "{what}");
            let (code, retry) = status(err);
            assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{what}");
            assert_eq!(retry.as_deref(), Some("1"), "{what}");
        }
    }

    #[test]
    fn faults_of_the_request_or_the_server_are_not_unavailability() {
        let cases = [
            (sqlx::Error::RowNotFound, StatusCode::NOT_FOUND),
            (
                sqlx::Error::Database(Box::new(Pg {
                    code: "23505",
                    kind: ErrorKind::UniqueViolation,
                })),
                StatusCode::CONFLICT,
            ),
            (
                sqlx::Error::Database(Box::new(Pg {
                    code: "23503",
                    kind: ErrorKind::ForeignKeyViolation,
                })),
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (pg("22021"), StatusCode::UNPROCESSABLE_ENTITY), // NUL byte in text
            (pg("42P01"), StatusCode::INTERNAL_SERVER_ERROR), // undefined table: a bug
            (pg("57014"), StatusCode::INTERNAL_SERVER_ERROR), // statement timeout
            (pg("40P01"), StatusCode::INTERNAL_SERVER_ERROR), // deadlock
            (
                sqlx::Error::Protocol("unexpected message".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                sqlx::Error::ColumnNotFound("x".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                sqlx::Error::Decode("bad".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (err, want) in cases {
            let what = format!("{err:?}");
            assert!(!db_unreachable(&err), "{what}");
            let (code, retry) = status(err);
            assert_eq!(code, want, "{what}");
            assert_eq!(retry, None, "{what}");
        }
    }

    #[test]
    fn an_unreachable_database_behind_anyhow_context_is_still_503() {
        let wrapped = anyhow::Error::from(pg("57P01")).context("reading node facts");
        assert_eq!(status(wrapped).0, StatusCode::SERVICE_UNAVAILABLE);
        let refused = anyhow::Error::from(sqlx::Error::Io(io::Error::from(
            io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(status(refused).0, StatusCode::SERVICE_UNAVAILABLE);
        // Other database errors behind anyhow stay internal, context and all.
        let bug = anyhow::Error::from(pg("42P01")).context("listing nodes");
        assert!(
            matches!(ApiError::from(bug), ApiError::Internal(e) if e.to_string() == "listing nodes")
        );
        assert_eq!(
            status(anyhow::anyhow!("plain")).0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
