//! Rendezvous blobs as stored (`rendezvous`): what rank 0 of a multi-node run posts for the
//! other ranks, once per name, and who may post or read it (the node's jobs in the run).

use sqlx::PgPool;
use uuid::Uuid;

/// Whether the node has a job in the run.
pub async fn is_member(db: &PgPool, run: Uuid, node: Uuid) -> sqlx::Result<bool> {
    let member = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM jobs WHERE run_id = $1 AND node_id = $2) AS "member!""#,
        run,
        node,
    )
    .fetch_one(db)
    .await?;
    Ok(member)
}

/// The node's first job in the run: its rank, the agent holding its claim and its state.
pub struct Rank {
    pub rank: i32,
    pub holder: Option<Uuid>,
    pub state: String,
}

pub async fn first_rank(db: &PgPool, run: Uuid, node: Uuid) -> sqlx::Result<Option<Rank>> {
    sqlx::query_as!(
        Rank,
        "SELECT rank, lease_agent_id AS holder, state FROM jobs WHERE run_id = $1 AND node_id = $2
         ORDER BY rank LIMIT 1",
        run,
        node,
    )
    .fetch_optional(db)
    .await
}

/// Stores the blob under its name unless one is there; false when one was.
pub async fn insert(db: &PgPool, run: Uuid, name: &str, blob: &[u8]) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "INSERT INTO rendezvous (run_id, name, blob) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        run,
        name,
        blob,
    )
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}

pub async fn blob(db: &PgPool, run: Uuid, name: &str) -> sqlx::Result<Option<Vec<u8>>> {
    sqlx::query_scalar!(
        "SELECT blob FROM rendezvous WHERE run_id = $1 AND name = $2",
        run,
        name,
    )
    .fetch_optional(db)
    .await
}
