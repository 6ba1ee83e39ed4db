//! A claim's result: stored once (idempotent on its upload key) with its measured rows,
//! and the job ended by it, in one transaction.
//!
//! A job belongs to whoever claimed it last: each claim gets a fresh `claim_id`, kept after
//! the lease ends. A result is accepted only under the job's latest claim.
//!
//! `results` is partitioned by month of arrival (docs/health.md, "History"), so no unique
//! index holds one result per job or per upload key: this transaction does, under the job's
//! row lock and an advisory lock on the upload key.

use heddle_types::jobs::{JobState, ResultUpload};
use uuid::Uuid;

use super::{JobError, store};

/// First key of the advisory lock on an upload key (the second is the key's hash); distinct
/// from the server's other advisory locks.
const UPLOAD_KEY_LOCK: i32 = 727_277;

/// Who uploads: the agent's id and its node.
#[derive(Debug, Clone, Copy)]
pub struct Uploader {
    pub agent_id: Uuid,
    pub node_id: Uuid,
}

/// What became of an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored now; its job has ended.
    New(Uuid),
    /// A retry of an upload stored before; nothing was stored again.
    Again(Uuid),
}

/// Stores `up` as the result of job `id` from `by`, and ends the job by it.
pub async fn store_result(
    db: &sqlx::PgPool,
    by: Uploader,
    id: Uuid,
    up: &ResultUpload,
) -> Result<Stored, JobError> {
    let mut tx = db.begin().await?;
    // The job row lock serialises concurrent uploads for one job (retries racing on two
    // replicas included).
    let job = sqlx::query!(
        "SELECT node_id, state, claim_id, claim_agent_id FROM jobs WHERE id = $1 FOR UPDATE",
        id
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(JobError::NoJob(id))?;
    if job.node_id != by.node_id {
        return Err(JobError::OtherNode(id));
    }
    // Two jobs' uploads naming one key take turns; one job's already do (its row lock).
    sqlx::query!(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        UPLOAD_KEY_LOCK,
        up.upload_key
    )
    .execute(&mut *tx)
    .await?;
    let by_key = sqlx::query!(
        "SELECT id, job_id, agent_id FROM results WHERE upload_key = $1",
        up.upload_key
    )
    .fetch_optional(&mut *tx)
    .await?;
    match by_key {
        // A retry of a stored upload: answered whatever became of the claim since.
        Some(r) if r.job_id == id && r.agent_id == Some(by.agent_id) => {
            return Ok(Stored::Again(r.id));
        }
        Some(_) => {
            return Err(JobError::Conflict(format!(
                "upload key {:?} was used for another job or by another agent",
                up.upload_key
            )));
        }
        None => {}
    }
    check_claim(
        id,
        job.claim_id,
        job.claim_agent_id,
        by.agent_id,
        up.claim_id,
    )?;
    let by_job = sqlx::query_scalar!("SELECT id FROM results WHERE job_id = $1", id)
        .fetch_optional(&mut *tx)
        .await?;
    if by_job.is_some() {
        return Err(JobError::Conflict(format!(
            "job {id} already has a result from another upload"
        )));
    }
    let outcome = up.outcome.job_state();
    let result_id = Uuid::new_v4();
    let received_at = sqlx::query_scalar!(
        "INSERT INTO results (id, job_id, upload_key, agent_id, outcome, reason, exit_code, stderr_tail, summary, started_at, finished_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING received_at",
        result_id,
        id,
        up.upload_key,
        by.agent_id,
        outcome.as_str(),
        up.reason,
        up.exit_code,
        up.stderr_tail.as_deref().map(|s| tail(s, 64 * 1024)),
        if up.summary.is_null() {
            serde_json::json!({})
        } else {
            up.summary.clone()
        },
        up.started_at,
        up.finished_at,
    )
    .fetch_one(&mut *tx)
    .await?;
    insert_rows(&mut tx, result_id, received_at, up).await?;
    let current: JobState = job.state.parse().map_err(|message| JobError::Corrupt {
        what: "job state",
        message,
    })?;
    store::finish(
        &mut tx,
        id,
        current,
        outcome,
        up.started_at,
        up.reason.as_deref(),
    )
    .await?;
    tx.commit().await?;
    Ok(Stored::New(result_id))
}

/// A new result is stored only from the agent that made the job's latest claim, and under
/// that claim when the upload names one. (An upload that names none comes from an agent
/// older than claim ids; its agent must still be the latest claimant.)
fn check_claim(
    job: Uuid,
    current: Option<Uuid>,
    claimant: Option<Uuid>,
    agent: Uuid,
    sent: Option<Uuid>,
) -> Result<(), JobError> {
    if current.is_none() {
        return Err(JobError::StaleClaim(format!(
            "job {job} was never claimed; a result needs the claim it ran under"
        )));
    }
    if claimant != Some(agent) || sent.is_some_and(|c| Some(c) != current) {
        return Err(JobError::StaleClaim(format!(
            "job {job} was claimed again after the claim this result ran under; the job's \
             current claim decides its result, so this one is not stored"
        )));
    }
    Ok(())
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Rows carry their result's arrival: the month they are kept in.
async fn insert_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    result_id: Uuid,
    received_at: chrono::DateTime<chrono::Utc>,
    up: &ResultUpload,
) -> Result<(), sqlx::Error> {
    // Postgres caps a statement at 65535 bind parameters; 15 per row.
    for (chunk_no, chunk) in up.rows.chunks(4000).enumerate() {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO result_rows (result_id, seq, size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs, busbw_gbs, wrong, labels, extra, received_at) ",
        );
        qb.push_values(chunk.iter().enumerate(), |mut b, (i, r)| {
            b.push_bind(result_id)
                .push_bind(i32::try_from(chunk_no * 4000 + i).unwrap_or(i32::MAX))
                .push_bind(r.size_bytes)
                .push_bind(r.count)
                .push_bind(&r.dtype)
                .push_bind(&r.op)
                .push_bind(r.root)
                .push_bind(r.in_place)
                .push_bind(r.time_us.filter(|v| v.is_finite()))
                .push_bind(r.algbw_gbs.filter(|v| v.is_finite()))
                .push_bind(r.busbw_gbs.filter(|v| v.is_finite()))
                .push_bind(r.wrong)
                .push_bind(sqlx::types::Json(&r.labels))
                .push_bind(if r.extra.is_null() {
                    serde_json::json!({})
                } else {
                    r.extra.clone()
                })
                .push_bind(received_at);
        });
        qb.build().execute(&mut **tx).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        assert_eq!(super::tail("abc", 10), "abc");
        assert_eq!(super::tail("abcdef", 3), "def");
        assert_eq!(super::tail("aé", 1), "");
        assert_eq!(super::tail("aéb", 2), "b");
    }
}
