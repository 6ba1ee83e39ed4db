//! The job environment versions that no one has computed since a write made them unknown
//! (`nodes.job_env_sha256 IS NULL`), computed in batches by the versions worker
//! (`workers/job_env_versions.rs`) rather than by the heartbeats that find them missing.

use sqlx::PgPool;
use uuid::Uuid;

use heddle_types::nccl_conf;

/// Nodes computed in one transaction: a batch's environments are read in two queries
/// (`recommendations::explain_many`) and its versions written in one.
pub const REFRESH_BATCH: i64 = 500;

/// Computes and stores the version of at most `limit` nodes whose version is unknown, in
/// one transaction that holds their rows (`FOR UPDATE SKIP LOCKED`: replicas share the
/// work, and a writer of a node's environment waits for its batch or is seen by it).
/// Returns the versions stored, by node.
pub async fn refresh_due(db: &PgPool, limit: i64) -> sqlx::Result<Vec<(Uuid, String)>> {
    let mut tx = db.begin().await?;
    let due: Vec<Uuid> = sqlx::query_scalar!(
        "SELECT id FROM nodes WHERE job_env_sha256 IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        limit
    )
    .fetch_all(&mut *tx)
    .await?;
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let computed = super::job_envs(&mut tx, &due).await?;
    let mut ids = Vec::with_capacity(computed.len());
    let mut shas = Vec::with_capacity(computed.len());
    for (node, env) in computed {
        let sha = nccl_conf::job_env_sha256(&env.entries)
            .map_err(|e| sqlx::Error::Protocol(format!("job environment of node {node}: {e}")))?;
        ids.push(node);
        shas.push(sha);
    }
    sqlx::query!(
        "UPDATE nodes n SET job_env_sha256 = u.sha FROM unnest($1::uuid[], $2::text[]) AS u(id, sha)
         WHERE n.id = u.id",
        &ids,
        &shas
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(ids.into_iter().zip(shas).collect())
}
