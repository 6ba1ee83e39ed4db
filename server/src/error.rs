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
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

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
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                ApiError::Unavailable(err)
            }
            _ => ApiError::Internal(err.into()),
        }
    }
}

/// A variable, value or text the environment policy refuses: the input is at fault.
impl From<heddle_types::env_policy::EnvError> for ApiError {
    fn from(err: heddle_types::env_policy::EnvError) -> Self {
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
            HealthError::Database(e) => e.into(),
            other @ HealthError::Decode { .. } => ApiError::Internal(other.into()),
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

impl From<crate::health::investigate::InvestigateError> for ApiError {
    fn from(err: crate::health::investigate::InvestigateError) -> Self {
        use crate::health::investigate::InvestigateError as E;
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

pub use crate::json::Json;

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
