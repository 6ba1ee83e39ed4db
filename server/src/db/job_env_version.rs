//! The version column of a node's job environment (`nodes.job_env_sha256`), set to NULL by
//! every writer of what the job environment is computed from (recommendations, tuning
//! profiles, a node's site). Here, below both `recommendations` and `job_env`, so that the
//! writers and the reader share it without calling each other; `job_env.rs` says why NULL.

use sqlx::PgConnection;
use uuid::Uuid;

/// Whose job environment a write may have changed.
pub enum Changed<'a> {
    Nodes(&'a [Uuid]),
    /// Every node of a site (a site tuning profile).
    Site(Uuid),
}

/// Marks the job environment of `changed` as to be recomputed, and returns the nodes it
/// covers (for `job_env::JobEnvSeen::forget` once the transaction committed). Call it in the
/// transaction that writes what the job environment is computed from.
pub async fn mark_changed(
    conn: &mut PgConnection,
    changed: Changed<'_>,
) -> sqlx::Result<Vec<Uuid>> {
    let nodes: Vec<Uuid> = match changed {
        // A node's must-agree values decide what its site's other nodes may write
        // (`job_env::keep_rank_agreed`), so their versions go too.
        Changed::Nodes(nodes) => {
            sqlx::query_scalar!(
                "SELECT n.id FROM nodes n WHERE n.id = ANY($1)
                 OR n.site_id IN (SELECT site_id FROM nodes WHERE id = ANY($1) AND site_id IS NOT NULL)",
                nodes,
            )
            .fetch_all(&mut *conn)
            .await?
        }
        Changed::Site(site) => {
            sqlx::query_scalar!("SELECT id FROM nodes WHERE site_id = $1", site)
                .fetch_all(&mut *conn)
                .await?
        }
    };
    // Every row, NULL ones included: a row already NULL may be under a computation
    // (`job_env::refresh_due` holds it) that read the environment before this write; the
    // UPDATE waits for it and makes the version unknown again after it.
    sqlx::query!(
        "UPDATE nodes SET job_env_sha256 = NULL WHERE id = ANY($1)",
        &nodes
    )
    .execute(&mut *conn)
    .await?;
    Ok(nodes)
}
