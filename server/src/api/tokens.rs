//! API tokens, enrollment tokens, agents and the audit log: who may do what. The tokens'
//! rows are `tokens.rs`'s.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use heddle_types::auth::*;
use serde::Deserialize;
use uuid::Uuid;

use crate::http::auth::{self, Caller};
use crate::http::error::{ApiError, ApiResult, Json, Path, Query, duplicate_name};
use crate::state::AppState;
use crate::tokens;
use crate::{db, enrollment};

/// Who am I: the name and role of the presented token.
#[utoipa::path(get, path = "/api/v1/whoami", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, body = WhoAmI), (status = 401, body = heddle_types::ErrorBody)))]
pub async fn whoami(caller: Caller) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: caller.name,
        role: caller.role,
    })
}

/// Sign the dashboard in: the token is checked and handed back as an HttpOnly,
/// SameSite=Strict cookie, so the page's scripts never hold it.
#[utoipa::path(post, path = "/api/v1/session", tag = "tokens", request_body = SessionCreate,
    responses((status = 200, body = WhoAmI), (status = 401, body = heddle_types::ErrorBody)))]
pub async fn create_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    Json(req): Json<SessionCreate>,
) -> ApiResult<Response> {
    let caller = auth::caller_for_token(&state, req.token.trim()).await?;
    // The scheme the browser sees (behind a TLS-terminating proxy too).
    let https = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|o| o.starts_with("https://"))
        || headers
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let cookie = auth::session_set_cookie(req.token.trim(), https).ok_or_else(|| {
        ApiError::Unprocessable(
            "this token has characters a cookie cannot hold; use it with the CLI or API".into(),
        )
    })?;
    Ok((
        [(header::SET_COOKIE, cookie)],
        Json(WhoAmI {
            name: caller.name,
            role: caller.role,
        }),
    )
        .into_response())
}

/// Sign the dashboard out: the session cookie is cleared.
#[utoipa::path(delete, path = "/api/v1/session", tag = "tokens", responses((status = 204)))]
pub async fn delete_session() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(header::SET_COOKIE, auth::session_clear_cookie())],
    )
        .into_response()
}

/// Create an API token. The secret is in the response and nowhere else.
#[utoipa::path(post, path = "/api/v1/tokens", tag = "tokens", security(("bearer" = [])), request_body = TokenCreate,
    responses((status = 201, body = TokenCreated), (status = 409, body = heddle_types::ErrorBody)))]
pub async fn create_token(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<TokenCreate>,
) -> ApiResult<(StatusCode, Json<TokenCreated>)> {
    caller.require(Role::Admin)?;
    db::check_name("token name", &req.name)?;
    let secret = auth::new_secret(auth::API_TOKEN_PREFIX);
    let expires_at = req
        .expires_in_days
        .map(|d| Utc::now() + chrono::Duration::days(i64::from(d.min(3650))));
    let mut tx = state.db.begin().await?;
    let sha = auth::sha256_hex(&secret);
    let new = tokens::NewApiToken {
        name: &req.name,
        role: req.role,
        secret_sha256: &sha,
        expires_at,
    };
    let info = tokens::insert_api_token(&mut tx, &new)
        .await
        .map_err(duplicate_name("token", &req.name))?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "token.create",
        &format!("token:{}", req.name),
        serde_json::json!({"role": req.role}),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            info,
            token: secret,
        }),
    ))
}

/// List API tokens (never their secrets).
#[utoipa::path(get, path = "/api/v1/tokens", tag = "tokens", security(("bearer" = [])),
    responses((status = 200, body = [TokenInfo])))]
pub async fn list_tokens(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<TokenInfo>>> {
    caller.require(Role::Admin)?;
    Ok(Json(tokens::api_tokens(&state.db).await?))
}

/// Revoke an API token. It stops working at once.
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "tokens", security(("bearer" = [])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn revoke_token(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Admin)?;
    let mut tx = state.db.begin().await?;
    let name = tokens::revoke_api_token(&mut tx, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no token {id}")))?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "token.revoke",
        &format!("token:{name}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Uses of an enrollment token unless the request says otherwise: one agent.
pub const DEFAULT_ENROLL_USES: u32 = 1;
/// Life of an enrollment token unless the request says otherwise.
pub const DEFAULT_ENROLL_HOURS: u32 = 1;

/// Create an enrollment token that agents exchange for their own credential. One use and
/// one hour unless asked otherwise; `node` binds it to one host name.
#[utoipa::path(post, path = "/api/v1/enrollment-tokens", tag = "agents", security(("bearer" = [])),
    request_body = EnrollmentTokenCreate, responses((status = 201, body = EnrollmentTokenCreated)))]
pub async fn create_enrollment_token(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<EnrollmentTokenCreate>,
) -> ApiResult<(StatusCode, Json<EnrollmentTokenCreated>)> {
    caller.require(Role::Admin)?;
    let max_uses = req.max_uses.unwrap_or(DEFAULT_ENROLL_USES);
    if max_uses == 0 || max_uses > 1_000_000 {
        return Err(ApiError::Unprocessable(
            "max_uses must be between 1 and 1000000".into(),
        ));
    }
    if let Some(name) = &req.name {
        heddle_types::names::check_label("the token's name", name)
            .map_err(ApiError::Unprocessable)?;
    }
    if let Some(node) = &req.node {
        super::enroll::check_hostname(node)?;
        if max_uses != 1 {
            return Err(ApiError::Unprocessable(
                "a token bound to a node enrolls one agent: leave max_uses out or set it to 1"
                    .into(),
            ));
        }
    }
    let hours = i64::from(
        req.expires_in_hours
            .unwrap_or(DEFAULT_ENROLL_HOURS)
            .clamp(1, 24 * 365),
    );
    let secret = auth::new_secret(auth::ENROLL_TOKEN_PREFIX);
    let mut tx = state.db.begin().await?;
    let sha = auth::sha256_hex(&secret);
    let actor = caller.actor();
    let new = tokens::NewEnrollmentToken {
        name: req.name.as_deref(),
        secret_sha256: &sha,
        max_uses: i32::try_from(max_uses).unwrap_or(i32::MAX),
        created_by: &actor,
        expires_in_hours: i32::try_from(hours).unwrap_or(24),
        node: req.node.as_deref(),
    };
    let info = tokens::insert_enrollment_token(&mut tx, &new).await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "enrollment_token.create",
        &format!("enrollment_token:{}", info.id),
        serde_json::json!({"max_uses": max_uses, "expires_in_hours": hours, "node": req.node}),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(EnrollmentTokenCreated {
            info,
            token: secret,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/enrollment-tokens", tag = "agents", security(("bearer" = [])),
    responses((status = 200, body = [EnrollmentTokenInfo])))]
pub async fn list_enrollment_tokens(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<EnrollmentTokenInfo>>> {
    caller.require(Role::Admin)?;
    Ok(Json(tokens::enrollment_tokens(&state.db).await?))
}

#[utoipa::path(delete, path = "/api/v1/enrollment-tokens/{id}", tag = "agents", security(("bearer" = [])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn revoke_enrollment_token(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Admin)?;
    let mut tx = state.db.begin().await?;
    if !tokens::revoke_enrollment_token(&mut tx, id).await? {
        return Err(ApiError::NotFound(format!("no enrollment token {id}")));
    }
    db::audit(
        &mut *tx,
        &caller.actor(),
        "enrollment_token.revoke",
        &format!("enrollment_token:{id}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// List agents with their health.
#[utoipa::path(get, path = "/api/v1/agents", tag = "agents", security(("bearer" = [])),
    responses((status = 200, body = [AgentInfo])))]
pub async fn list_agents(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<AgentInfo>>> {
    caller.require(Role::Viewer)?;
    let rows = enrollment::agents(&state.db).await?;
    let hb = state.config.heartbeat_interval();
    Ok(Json(
        rows.into_iter()
            .map(|r| AgentInfo {
                state: if r.revoked_at.is_some() {
                    "revoked".into()
                } else {
                    db::liveness(r.last_heartbeat_at, hb).as_str().into()
                },
                id: r.id,
                node_id: r.node_id,
                hostname: r.hostname,
                version: r.version,
                created_at: r.created_at,
                last_heartbeat_at: r.last_heartbeat_at,
                revoked_at: r.revoked_at,
            })
            .collect(),
    ))
}

/// Revoke an agent: its credential stops working and its running jobs are requeued.
#[utoipa::path(delete, path = "/api/v1/agents/{id}", tag = "agents", security(("bearer" = [])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn revoke_agent(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Admin)?;
    let mut tx = state.db.begin().await?;
    if !enrollment::revoke_agent(&mut tx, id).await? {
        return Err(ApiError::NotFound(format!("no agent {id}")));
    }
    // Its leases end now rather than at expiry: nobody will renew them.
    crate::jobs::store::end_leases_of(&mut tx, &[id]).await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "agent.revoke",
        &format!("agent:{id}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    // Other replicas forget it through the revocation log (`credentials.rs`).
    state.credentials.forget_agents(&[id]);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Most recent entries first; at most 1000.
    limit: Option<i64>,
    /// Only entries whose action starts with this, e.g. `plugin.`.
    action: Option<String>,
}

/// The audit log of writes, newest first.
#[utoipa::path(get, path = "/api/v1/audit", tag = "tokens", security(("bearer" = [])), params(AuditQuery),
    responses((status = 200, body = [AuditEntry])))]
pub async fn audit_log(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Json<Vec<AuditEntry>>> {
    caller.require(Role::Admin)?;
    let entries =
        db::audit_entries(&state.db, q.action.as_deref(), super::limit(q.limit, 100)).await?;
    Ok(Json(entries))
}
