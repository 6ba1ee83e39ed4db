//! Rendezvous: rank 0 of a multi-node run posts an opaque blob (an NCCL unique id, a
//! server address) and the other ranks wait for it. Postgres holds the blobs, so ranks may
//! talk to different replicas.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;
use heddle_types::agent::RendezvousBlob;
use serde::Deserialize;
use uuid::Uuid;

use crate::http::auth::AgentCaller;
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::jobs::rendezvous::{self, Rank};
use crate::state::AppState;

/// Agents may only meet in runs they take part in.
async fn check_member(state: &AppState, agent: &AgentCaller, run: Uuid) -> ApiResult<()> {
    let member = rendezvous::is_member(&state.db, run, agent.node_id).await?;
    if member {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "this node has no job in run {run}"
        )))
    }
}

/// Only rank 0 publishes, and only while this agent holds its job's claim: any other rank,
/// or an agent whose claim went stale, would hand the run's peers a blob of its choosing.
async fn check_root(state: &AppState, agent: &AgentCaller, run: Uuid) -> ApiResult<()> {
    let rank = rendezvous::first_rank(&state.db, run, agent.node_id).await?;
    match rank {
        None => Err(ApiError::Forbidden(format!(
            "this node has no job in run {run}"
        ))),
        Some(r) if r.rank != 0 => Err(ApiError::Forbidden(format!(
            "only rank 0 publishes rendezvous blobs; this node is rank {} of run {run}",
            r.rank
        ))),
        Some(Rank {
            holder, state: st, ..
        }) if holder != Some(agent.agent_id) || !matches!(st.as_str(), "leased" | "running") => {
            Err(ApiError::StaleClaim(format!(
                "rank 0 of run {run} is {st} and not claimed by this agent; only the agent \
                 holding its current claim publishes"
            )))
        }
        Some(_) => Ok(()),
    }
}

fn check_rdv_name(name: &str) -> ApiResult<()> {
    let rule = heddle_types::names::RENDEZVOUS;
    if !rule.allows(name) {
        return Err(ApiError::BadRequest(format!(
            "rendezvous name must be {}",
            rule.describe()
        )));
    }
    Ok(())
}

/// Rank 0 posts an opaque blob (e.g. an NCCL unique id) for the other ranks.
#[utoipa::path(put, path = "/api/v1/agent/rendezvous/{run_id}/{name}", tag = "agent", security(("agent" = [])),
    params(("run_id" = Uuid, Path), ("name" = String, Path)), request_body = RendezvousBlob,
    responses((status = 204), (status = 409, body = heddle_types::ErrorBody, description = "a different blob is already posted")))]
pub async fn rendezvous_put(
    State(state): State<AppState>,
    agent: AgentCaller,
    Path((run, name)): Path<(Uuid, String)>,
    Json(req): Json<RendezvousBlob>,
) -> ApiResult<StatusCode> {
    check_rdv_name(&name)?;
    check_root(&state, &agent, run).await?;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(&req.blob_b64)
        .map_err(|e| ApiError::BadRequest(format!("blob_b64 is not base64: {e}")))?;
    if blob.len() > 64 * 1024 {
        return Err(ApiError::PayloadTooLarge(
            "rendezvous blobs are at most 64 KiB".into(),
        ));
    }
    let inserted = rendezvous::insert(&state.db, run, &name, &blob).await?;
    if !inserted {
        let stored = rendezvous::blob(&state.db, run, &name).await?;
        if stored.as_deref() != Some(blob.as_slice()) {
            return Err(ApiError::Conflict(format!(
                "rendezvous {name:?} of run {run} already holds another blob"
            )));
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// How long to wait for rank 0 (default 30000, at most 120000).
    timeout_ms: Option<u64>,
}

/// Wait for rank 0's blob; answers 408 `rendezvous_timeout` when it does not come in time.
#[utoipa::path(get, path = "/api/v1/agent/rendezvous/{run_id}/{name}", tag = "agent", security(("agent" = [])),
    params(("run_id" = Uuid, Path), ("name" = String, Path), WaitQuery),
    responses((status = 200, body = RendezvousBlob), (status = 408, body = heddle_types::ErrorBody)))]
pub async fn rendezvous_get(
    State(state): State<AppState>,
    agent: AgentCaller,
    Path((run, name)): Path<(Uuid, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Json<RendezvousBlob>> {
    check_rdv_name(&name)?;
    check_member(&state, &agent, run).await?;
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(q.timeout_ms.unwrap_or(30_000).min(120_000));
    // Polling keeps replicas independent: whichever one rank 0 posted to, Postgres has it.
    loop {
        let row = rendezvous::blob(&state.db, run, &name).await?;
        if let Some(blob) = row {
            return Ok(Json(RendezvousBlob {
                blob_b64: base64::engine::general_purpose::STANDARD.encode(blob),
            }));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::Timeout(
                "rendezvous_timeout",
                format!("nothing posted to rendezvous {name:?} of run {run} in time"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
