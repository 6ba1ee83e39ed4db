//! Decommissioning: `DELETE /api/v1/nodes/{node}` removes a node that left the fleet.
//!
//! Refused (409) while the node has a job that is queued, leased or running: cancel its
//! runs first, so no agent is still working for a node that is gone. Otherwise, in one
//! transaction with its audit entry, the node goes with everything that is only about it:
//! its agents (their credentials stop working at once: 401, enroll again), facts and facts
//! history, plugin results, expectations, verdicts, and its jobs of finished runs with
//! their results (the rest of a multi-node run stays). A node of the same host name that
//! enrolls later is a new node.

use axum::extract::State;
use axum::http::StatusCode;
use heddle_types::auth::Role;

use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Path};
use crate::state::AppState;
use crate::{db, nodes};

/// Remove a decommissioned node and what is only about it (admin).
#[utoipa::path(delete, path = "/api/v1/nodes/{node}", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path, description = "node id or hostname")),
    responses((status = 204, description = "removed"), (status = 403, body = heddle_types::ErrorBody),
        (status = 404, body = heddle_types::ErrorBody),
        (status = 409, body = heddle_types::ErrorBody, description = "the node has queued or running jobs")))]
pub async fn delete_node(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Admin)?;
    let mut tx = state.db.begin().await?;
    let id = db::resolve_node(&mut *tx, &key).await?;
    // The row lock keeps a run from adding a job to the node while it is being removed.
    let nodes::Holdings {
        hostname,
        active_jobs: active,
        jobs,
        results,
        agents,
    } = nodes::lock_for_removal(&mut tx, id).await?;
    if active > 0 {
        return Err(ApiError::Conflict(format!(
            "node {hostname:?} has {active} queued or running jobs; cancel their runs \
             (heddle runs cancel) and delete it again"
        )));
    }
    nodes::delete(&mut tx, id).await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "node.delete",
        &format!("node:{hostname}"),
        serde_json::json!({
            "node_id": id,
            "agents": agents,
            "jobs": jobs,
            "results": results,
        }),
    )
    .await?;
    tx.commit().await?;
    state.credentials.forget_node(id);
    tracing::info!(%id, hostname, jobs, results, "node deleted");
    Ok(StatusCode::NO_CONTENT)
}
