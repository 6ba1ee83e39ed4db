//! A job's ranks on every node where it runs under one key and owner: read together to be
//! judged (`health::observed::ranks`), and the verdict stored per job key and owner (a job
//! known only by its process, per node too).

use heddle_types::health::{Reason, Verdict};
use heddle_types::observe::Progress;
use heddle_types::observed::RankRow;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::store::MAX_ROWS_PER_JOB;

/// A job's rows on every node (its group, `observed_jobs.scope`): what its ranks are judged
/// on.
#[derive(Debug, Clone)]
pub struct RankRowStored {
    pub hostname: String,
    pub comm_hash: String,
    pub nranks: i32,
    pub rank: i32,
    pub progress: Json<Progress>,
    pub clock_offset_ns: i64,
    pub finalized: bool,
    pub silent_s: f64,
}

/// The group of job `id` (key, uid and scope) and its ranks' latest reports, newest first
/// per rank, at most [`MAX_ROWS_PER_JOB`].
pub async fn group_ranks(
    db: &PgPool,
    id: Uuid,
) -> Result<Option<((String, i64, Uuid), Vec<RankRowStored>)>, sqlx::Error> {
    let Some(group) = sqlx::query!(
        "SELECT job_key, uid, scope FROM observed_jobs WHERE id = $1",
        id
    )
    .fetch_optional(db)
    .await?
    else {
        return Ok(None);
    };
    let rows = sqlx::query_as!(
        RankRowStored,
        r#"SELECT n.hostname, c.comm_hash, c.nranks, c.rank, c.progress AS "progress!: Json<Progress>",
                c.clock_offset_ns, c.finalized OR c.is_final AS "finalized!",
                extract(epoch FROM now() - c.received_at)::float8 AS "silent_s!"
         FROM observed_comms c JOIN observed_jobs j ON j.id = c.job_id JOIN nodes n ON n.id = j.node_id
         WHERE (j.job_key, j.uid, j.scope) = ($1, $2, $3) AND c.progress IS NOT NULL
         ORDER BY c.comm_hash, c.rank, c.received_at DESC LIMIT $4"#,
        group.job_key,
        group.uid,
        group.scope,
        MAX_ROWS_PER_JOB,
    )
    .fetch_all(db)
    .await?;
    Ok(Some(((group.job_key, group.uid, group.scope), rows)))
}

/// Stores the verdict on a job's ranks across nodes.
pub async fn set_progress_verdict(
    db: &PgPool,
    group: &(String, i64, Uuid),
    verdict: Verdict,
    reasons: &[Reason],
    ranks: &[RankRow],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO observed_progress (job_key, uid, scope, verdict, reasons, ranks)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (job_key, uid, scope) DO UPDATE SET verdict = EXCLUDED.verdict,
             reasons = EXCLUDED.reasons, ranks = EXCLUDED.ranks, judged_at = now()",
        group.0,
        group.1,
        group.2,
        verdict.as_str(),
        Json(reasons) as _,
        Json(ranks) as _,
    )
    .execute(db)
    .await?;
    Ok(())
}
