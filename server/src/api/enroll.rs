//! Enrollment: an agent exchanges an enrollment token for its own credential.
//!
//! A host name is a node's identity, and the node's jobs follow it. So an enrollment under
//! the host name of a node whose agent is still live replaces nothing by itself: it is held
//! until an admin approves it (`heddle agents approve`), unless its token was bound to that
//! node (`heddle agents enroll-token --node HOST`). The waiting agent gets 202 with a
//! ticket and asks again with it; the live agent keeps working meanwhile.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use heddle_types::agent::{EnrollPending, EnrollRequest, EnrollResponse};
use heddle_types::auth::{PendingEnrollment, Role};
use uuid::Uuid;

use crate::db;
use crate::enrollment::{self, Ticket, TokenState};
use crate::http::auth::{self, Caller};
use crate::http::error::{ApiError, ApiResult, Json, Path};
use crate::state::AppState;
use crate::token_uses::{self, TakenUse};

/// Prefix of pending-enrollment tickets (secrets, like the other credentials).
pub const TICKET_PREFIX: &str = "hdp_";

/// How long a waiting agent pauses between asks.
const RETRY_AFTER_S: u32 = 5;

/// Host names as nodes are named: what an agent may enroll under and a token be bound to.
pub fn check_hostname(hostname: &str) -> ApiResult<()> {
    if heddle_types::names::HOSTNAME.allows(hostname) {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "hostname {hostname:?} is not a valid host name"
        )))
    }
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Postgres>;

/// Says why an enrollment token cannot be used for `hostname` (unknown, revoked, expired,
/// used up, bound to another node), for [`take_use`] when it could not take a use; `Ok`
/// when it could be used after all.
async fn check_token(tx: &mut Tx<'_>, secret: &str, hostname: &str) -> ApiResult<TokenState> {
    let row = enrollment::token_state(tx, &auth::sha256_hex(secret)).await?;
    let new_token = "ask an admin for a new one (heddle agents enroll-token)";
    let token = row
        .ok_or_else(|| ApiError::Unauthorized(format!("unknown enrollment token; {new_token}")))?;
    if let Some(at) = token.revoked_at {
        return Err(ApiError::Unauthorized(format!(
            "this enrollment token was revoked at {at}; {new_token}"
        )));
    }
    if token.expires_at <= Utc::now() {
        return Err(ApiError::Unauthorized(format!(
            "this enrollment token expired at {}; {new_token}",
            token.expires_at
        )));
    }
    if token.uses >= token.max_uses {
        return Err(ApiError::Unauthorized(format!(
            "this enrollment token is used up ({} of {} uses); {new_token}",
            token.uses, token.max_uses
        )));
    }
    if let Some(node) = token.node.as_deref().filter(|n| *n != hostname) {
        return Err(ApiError::Unauthorized(format!(
            "this enrollment token is bound to node {node:?}, not {hostname:?}"
        )));
    }
    Ok(token)
}

/// Takes one use of the token for `hostname` (`token_uses.rs`), or says why it cannot be
/// used: unknown, used up, revoked, expired or bound elsewhere.
async fn take_use(state: &AppState, secret: &str, hostname: &str) -> ApiResult<TakenUse> {
    let sha = auth::sha256_hex(secret);
    if let Some(taken) = token_uses::take(&state.db, &state.token_uses, &sha, hostname).await? {
        return Ok(taken);
    }
    let mut tx = state.db.begin().await?;
    check_token(&mut tx, secret, hostname)
        .await
        .and(Err(ApiError::Unauthorized(
            "this enrollment token stopped being valid during the enrollment; ask an admin \
             for a new one (heddle agents enroll-token)"
                .into(),
        )))
}

/// Issues a credential for the node, revoking its live agent (whose leases end now). Only
/// called when replacing is allowed: no live agent, a token bound to the node, or an
/// admin's approval.
async fn issue(
    tx: &mut Tx<'_>,
    state: &AppState,
    node_id: Uuid,
    hostname: &str,
    token_id: Option<Uuid>,
    version: Option<&str>,
    how: &str,
) -> ApiResult<EnrollResponse> {
    let replaced = enrollment::revoke_live_agents(tx, node_id).await?;
    if !replaced.is_empty() {
        crate::jobs::store::end_leases_of(tx, &replaced).await?;
    }
    let credential = auth::new_secret(auth::AGENT_CREDENTIAL_PREFIX);
    let agent_id = Uuid::new_v4();
    let new = enrollment::NewAgent {
        id: agent_id,
        node_id,
        credential_sha256: &auth::sha256_hex(&credential),
        enrollment_token_id: token_id,
        version,
    };
    enrollment::insert_agent(tx, &new).await?;
    db::audit(
        &mut **tx,
        &format!("agent:{agent_id}"),
        "agent.enroll",
        &format!("node:{hostname}"),
        serde_json::json!({"replaced": replaced.len(), "version": version, "how": how}),
    )
    .await?;
    tracing::info!(%agent_id, %node_id, hostname, how, replaced = replaced.len(), "agent enrolled");
    Ok(EnrollResponse {
        agent_id,
        node_id,
        credential,
        heartbeat_interval_s: state.config.heartbeat_interval_s,
    })
}

fn waiting(pending_id: Uuid, hostname: &str, ticket: String) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(EnrollPending {
            pending_id,
            hostname: hostname.to_string(),
            ticket,
            message: format!(
                "node {hostname:?} already has a live agent; this enrollment is waiting for \
                 approval: heddle agents approve {pending_id} (or reject it: heddle agents \
                 reject {pending_id})"
            ),
            retry_after_s: RETRY_AFTER_S,
        }),
    )
        .into_response()
}

/// Exchange an enrollment token for the agent's own credential. A host name that already
/// has a live agent is held for approval (202) unless the token is bound to it.
#[utoipa::path(post, path = "/api/v1/agent/enroll", tag = "agent", request_body = EnrollRequest,
    responses((status = 201, body = EnrollResponse),
        (status = 202, body = EnrollPending, description = "held for an admin's approval; ask again with the ticket"),
        (status = 401, body = heddle_types::ErrorBody)))]
pub async fn enroll(
    State(state): State<AppState>,
    Json(req): Json<EnrollRequest>,
) -> ApiResult<Response> {
    let hostname = req.hostname.trim();
    check_hostname(hostname)?;
    super::agent::check_agent_version(req.agent_version.as_deref())?;
    if let Some(ticket) = &req.pending_ticket {
        let tx = state.db.begin().await?;
        return collect(tx, &state, hostname, ticket).await;
    }
    // The use first, on a connection of its own that is back in the pool before the
    // enrollment's transaction takes one: one connection per enrollment at a time.
    let token = take_use(&state, &req.enroll_token, hostname).await?;
    let enrolled = match state.db.begin().await {
        Ok(tx) => enroll_with(tx, &state, &req, hostname, &token).await,
        Err(err) => Err(err.into()),
    };
    if enrolled.is_err() {
        token_uses::give_back_one(&state.db, &state.token_uses, token.id).await;
    }
    enrolled
}

/// The enrollment itself, once its token's use is taken: a credential for a new node (or
/// for a node bound to the token), else a request waiting for an admin's approval.
async fn enroll_with(
    mut tx: Tx<'_>,
    state: &AppState,
    req: &EnrollRequest,
    hostname: &str,
    token: &TakenUse,
) -> ApiResult<Response> {
    let node_id = enrollment::upsert_node(&mut tx, hostname).await?;
    let live = enrollment::live_agent(&mut tx, node_id).await?;
    let version = req.agent_version.as_deref();
    if live.is_none() || token.node.is_some() {
        let how = if live.is_none() {
            "token"
        } else {
            "token bound to the node"
        };
        let resp = issue(
            &mut tx,
            state,
            node_id,
            hostname,
            Some(token.id),
            version,
            how,
        )
        .await?;
        tx.commit().await?;
        // The credential it replaced is forgotten here at once, elsewhere through the log.
        state.credentials.forget_node(node_id);
        return Ok((StatusCode::CREATED, Json(resp)).into_response());
    }
    let ticket = auth::new_secret(TICKET_PREFIX);
    let pending_id = Uuid::new_v4();
    let new = enrollment::NewPending {
        id: pending_id,
        node_id,
        hostname,
        ticket_sha256: &auth::sha256_hex(&ticket),
        enrollment_token_id: token.id,
        agent_version: version,
    };
    enrollment::insert_pending(&mut tx, &new).await?;
    db::audit(
        &mut *tx,
        &format!("enrollment:{pending_id}"),
        "agent.enroll_pending",
        &format!("node:{hostname}"),
        serde_json::json!({"live_agent": live, "version": version}),
    )
    .await?;
    tx.commit().await?;
    tracing::warn!(%pending_id, hostname, "enrollment under a live node's host name is waiting for approval");
    Ok(waiting(pending_id, hostname, ticket))
}

/// A waiting agent asks again with its ticket.
async fn collect(
    mut tx: Tx<'_>,
    state: &AppState,
    hostname: &str,
    ticket: &str,
) -> ApiResult<Response> {
    let row = enrollment::ticket_for_update(&mut tx, &auth::sha256_hex(ticket)).await?;
    let Some(Ticket {
        id,
        node_id,
        hostname: host,
        state: st,
        enrollment_token_id: token_id,
        agent_version: version,
        decided_by,
    }) = row
    else {
        return Err(ApiError::Unauthorized(
            "unknown enrollment ticket; enroll again with a new enrollment token".into(),
        ));
    };
    if host != hostname {
        return Err(ApiError::Unauthorized(format!(
            "this enrollment ticket is for node {host:?}, not {hostname:?}"
        )));
    }
    match st.as_str() {
        "pending" => Ok(waiting(id, hostname, ticket.to_string())),
        "rejected" => Err(ApiError::Unauthorized(format!(
            "the enrollment of {hostname:?} was rejected by {}; ask an admin for a token bound \
             to this node (heddle agents enroll-token --node {hostname})",
            decided_by.as_deref().unwrap_or("an admin")
        ))),
        "approved" => {
            let how = format!(
                "approved by {}",
                decided_by.as_deref().unwrap_or("an admin")
            );
            let resp = issue(
                &mut tx,
                state,
                node_id,
                hostname,
                token_id,
                version.as_deref(),
                &how,
            )
            .await?;
            enrollment::complete(&mut tx, id, resp.agent_id).await?;
            tx.commit().await?;
            state.credentials.forget_node(node_id);
            Ok((StatusCode::CREATED, Json(resp)).into_response())
        }
        _ => Err(ApiError::Unauthorized(
            "this enrollment ticket was already used; enroll again with a new enrollment token"
                .into(),
        )),
    }
}

/// Enrollments waiting for approval (and approved ones not yet collected).
#[utoipa::path(get, path = "/api/v1/agents/pending", tag = "agents", security(("bearer" = [])),
    responses((status = 200, body = [PendingEnrollment])))]
pub async fn list_pending(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<PendingEnrollment>>> {
    caller.require(Role::Admin)?;
    Ok(Json(enrollment::waiting(&state.db).await?))
}

async fn decide(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    to: &'static str,
) -> ApiResult<Json<PendingEnrollment>> {
    caller.require(Role::Admin)?;
    let mut tx = state.db.begin().await?;
    let current = enrollment::state_for_update(&mut tx, id).await?;
    let (st, hostname) =
        current.ok_or_else(|| ApiError::NotFound(format!("no pending enrollment {id}")))?;
    if st != "pending" {
        return Err(ApiError::Conflict(format!(
            "the enrollment {id} of {hostname:?} is already {st}"
        )));
    }
    enrollment::decide(&mut tx, id, to, &caller.actor()).await?;
    let action = if to == "approved" {
        "agent.enroll_approve"
    } else {
        "agent.enroll_reject"
    };
    db::audit(
        &mut *tx,
        &caller.actor(),
        action,
        &format!("node:{hostname}"),
        serde_json::json!({"pending_enrollment": id}),
    )
    .await?;
    let row = enrollment::pending(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Json(row))
}

/// Approve a waiting enrollment: when the agent asks again it gets a credential, and the
/// node's previous agent is revoked then.
#[utoipa::path(post, path = "/api/v1/agents/pending/{id}/approve", tag = "agents", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = PendingEnrollment), (status = 404, body = heddle_types::ErrorBody),
        (status = 409, body = heddle_types::ErrorBody)))]
pub async fn approve(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<PendingEnrollment>> {
    decide(&state, &caller, id, "approved").await
}

/// Reject a waiting enrollment: the agent is told so and stops asking.
#[utoipa::path(post, path = "/api/v1/agents/pending/{id}/reject", tag = "agents", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = PendingEnrollment), (status = 404, body = heddle_types::ErrorBody),
        (status = 409, body = heddle_types::ErrorBody)))]
pub async fn reject(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<PendingEnrollment>> {
    decide(&state, &caller, id, "rejected").await
}
