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
use uuid::Uuid;

use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Path};
use crate::state::AppState;

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
    let (hostname,): (String,) =
        sqlx::query_as("SELECT hostname FROM nodes WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
    let (active, jobs, results): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE j.state IN ('queued', 'leased', 'running')),
                count(*), count(r.id)
         FROM jobs j LEFT JOIN results r ON r.job_id = j.id WHERE j.node_id = $1",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    if active > 0 {
        return Err(ApiError::Conflict(format!(
            "node {hostname:?} has {active} queued or running jobs; cancel their runs \
             (heddle runs cancel) and delete it again"
        )));
    }
    let agents: Vec<(Uuid,)> = sqlx::query_as("SELECT id FROM agents WHERE node_id = $1")
        .bind(id)
        .fetch_all(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM nodes WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "node.delete",
        &format!("node:{hostname}"),
        serde_json::json!({
            "node_id": id,
            "agents": agents.iter().map(|a| a.0).collect::<Vec<_>>(),
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
