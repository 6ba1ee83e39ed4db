//! A claim's result: stored once (idempotent on its upload key) with its measured rows,
//! and the job ended by it, in one transaction, which its verdict then joins.
//!
//! A job belongs to whoever claimed it last: each claim gets a fresh `claim_id`, kept after
//! the lease ends. A result is accepted only under the job's latest claim.
//!
//! `results` is partitioned by month of arrival (docs/health.md, "History"), so no unique
//! index holds one result per job or per upload key: this transaction does, under the job's
//! row lock and an advisory lock on the upload key.

use chrono::{DateTime, Utc};
use heddle_types::jobs::{JobSpec, JobState, ResultRow, ResultUpload};
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
pub enum Stored {
    /// Stored now, its job ended by it, in a transaction not yet committed: judging it
    /// (`health::verdict::judge_upload`) continues in that transaction and commits it.
    New(Box<NewResult>),
    /// A retry of an upload stored before; nothing was stored again.
    Again(Uuid),
}

/// A result stored in `tx` and what its judgement needs that the upload does not hold (read
/// with the job's row lock, so judging reads none of it again).
pub struct NewResult {
    pub tx: sqlx::Transaction<'static, sqlx::Postgres>,
    pub result_id: Uuid,
    /// The result's arrival (`results.received_at`): the month it is kept in.
    pub received_at: DateTime<Utc>,
    /// How `results.outcome` names its outcome.
    pub outcome: &'static str,
    pub job: JobContext,
}

/// The job a result ends, its run's spec and its node as they are stored. The node and run
/// are `None` where their rows are gone.
#[derive(Debug, Clone)]
pub struct JobContext {
    pub run_id: Uuid,
    pub node_id: Uuid,
    pub world_size: i32,
    pub spec: Option<JobSpec>,
    pub node: Option<NodeContext>,
}

/// A node as judging reads it.
#[derive(Debug, Clone)]
pub struct NodeContext {
    pub hostname: String,
    pub gpu_model: Option<String>,
    pub gpu_count: i32,
    pub facts: Option<serde_json::Value>,
}

/// Stores `up` as the result of job `id` from `by`, and ends the job by it, in three
/// statements: the job's row lock (with the upload key's lock and what judging needs of the
/// job, its run and node), the result with its rows (`unnest` of one array per column),
/// the job's end (`store::finish`), in `tx`, a transaction begun by the caller. The
/// transaction is left open for the verdict.
pub async fn store_result(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    by: Uploader,
    id: Uuid,
    up: &ResultUpload,
) -> Result<Stored, JobError> {
    // The job row lock serialises concurrent uploads for one job (retries racing on two
    // replicas included); then two jobs' uploads naming one key take turns (the advisory
    // lock is taken after the row lock: the materialised CTE locks first). The reads that
    // must see what those locks protect come in the next statement, whose snapshot is
    // taken after both.
    let job = sqlx::query!(
        r#"WITH j AS MATERIALIZED (
             SELECT id, node_id, run_id, world_size, state, claim_id, claim_agent_id FROM jobs WHERE id = $1 FOR UPDATE)
         SELECT j.node_id AS "node_id!", j.run_id AS "run_id!", j.world_size AS "world_size!", j.state AS "state!",
                j.claim_id AS "claim_id?", j.claim_agent_id AS "claim_agent_id?", ru.spec AS "spec?",
                n.hostname AS "hostname?", n.gpu_model AS "gpu_model?", n.gpu_count AS "gpu_count?",
                n.facts AS "facts?", pg_advisory_xact_lock($2, hashtext($3))::text AS "locked?"
         FROM j LEFT JOIN runs ru ON ru.id = j.run_id LEFT JOIN nodes n ON n.id = j.node_id"#,
        id,
        UPLOAD_KEY_LOCK,
        up.upload_key
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(JobError::NoJob(id))?;
    if job.node_id != by.node_id {
        return Err(JobError::OtherNode(id));
    }
    let claim = check_claim(
        id,
        job.claim_id,
        job.claim_agent_id,
        by.agent_id,
        up.claim_id,
    );
    let outcome = up.outcome.job_state();
    let result_id = Uuid::new_v4();
    let rows = Columns::of(&up.rows);
    // Looked up by key and by job, and stored only when neither finds one and the claim
    // holds: all under the locks above.
    let stored = sqlx::query!(
        r#"WITH by_key AS (SELECT id, job_id, agent_id FROM results WHERE upload_key = $3 LIMIT 1),
             by_job AS (SELECT id FROM results WHERE job_id = $2 LIMIT 1),
             r AS (
               INSERT INTO results (id, job_id, upload_key, agent_id, outcome, reason, exit_code, stderr_tail, summary,
                                    started_at, finished_at)
               SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
               WHERE $12 AND NOT EXISTS (SELECT FROM by_key) AND NOT EXISTS (SELECT FROM by_job)
               RETURNING received_at),
             rows AS (
               INSERT INTO result_rows (result_id, seq, size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs,
                                        busbw_gbs, wrong, labels, extra, received_at)
               SELECT $1, (u.n - 1)::int, u.size_bytes, u.count, u.dtype, u.op, u.root, u.in_place, u.time_us, u.algbw_gbs,
                      u.busbw_gbs, u.wrong, u.labels, u.extra, r.received_at
               FROM r, unnest($13::int8[], $14::int8[], $15::text[], $16::text[], $17::int4[], $18::bool[], $19::float8[],
                              $20::float8[], $21::float8[], $22::int8[], $23::jsonb[], $24::jsonb[])
                       WITH ORDINALITY AS u(size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs, busbw_gbs,
                                            wrong, labels, extra, n))
         SELECT (SELECT received_at FROM r) AS received_at, (SELECT id FROM by_key) AS key_result,
                (SELECT job_id FROM by_key) AS key_job, (SELECT agent_id FROM by_key) AS key_agent,
                (SELECT id FROM by_job) AS job_result"#,
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
        claim.is_ok(),
        &rows.size_bytes as _,
        &rows.count as _,
        &rows.dtype as _,
        &rows.op as _,
        &rows.root as _,
        &rows.in_place as _,
        &rows.time_us as _,
        &rows.algbw_gbs as _,
        &rows.busbw_gbs as _,
        &rows.wrong as _,
        &rows.labels as _,
        &rows.extra as _,
    )
    .fetch_one(&mut *tx)
    .await?;
    match (stored.key_result, stored.key_job) {
        // A retry of a stored upload: answered whatever became of the claim since.
        (Some(r), Some(job_id)) if job_id == id && stored.key_agent == Some(by.agent_id) => {
            return Ok(Stored::Again(r));
        }
        (Some(_), _) => {
            return Err(JobError::Conflict(format!(
                "upload key {:?} was used for another job or by another agent",
                up.upload_key
            )));
        }
        (None, _) => {}
    }
    claim?;
    if stored.job_result.is_some() {
        return Err(JobError::Conflict(format!(
            "job {id} already has a result from another upload"
        )));
    }
    let received_at = stored.received_at.ok_or(JobError::Corrupt {
        what: "result",
        message: "the result was not stored".into(),
    })?;
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
    let spec = job
        .spec
        .map(serde_json::from_value::<JobSpec>)
        .transpose()
        .map_err(|e| JobError::Corrupt {
            what: "run spec",
            message: e.to_string(),
        });
    let node = match (job.hostname, job.gpu_count) {
        (Some(hostname), Some(gpu_count)) => Some(NodeContext {
            hostname,
            gpu_model: job.gpu_model,
            gpu_count,
            facts: job.facts,
        }),
        _ => None,
    };
    Ok(Stored::New(Box::new(NewResult {
        tx,
        result_id,
        received_at,
        outcome: outcome.as_str(),
        job: JobContext {
            run_id: job.run_id,
            node_id: job.node_id,
            world_size: job.world_size,
            // A spec that does not decode fails its judgement, not the upload.
            spec: spec.ok().flatten(),
            node,
        },
    })))
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

/// The rows of an upload as one array per column, for `unnest`: one statement stores any
/// number of them. Figures that are not finite are stored as NULL.
struct Columns {
    size_bytes: Vec<i64>,
    count: Vec<Option<i64>>,
    dtype: Vec<Option<String>>,
    op: Vec<Option<String>>,
    root: Vec<Option<i32>>,
    in_place: Vec<Option<bool>>,
    time_us: Vec<Option<f64>>,
    algbw_gbs: Vec<Option<f64>>,
    busbw_gbs: Vec<Option<f64>>,
    wrong: Vec<Option<i64>>,
    labels: Vec<serde_json::Value>,
    extra: Vec<serde_json::Value>,
}

impl Columns {
    fn of(rows: &[ResultRow]) -> Columns {
        let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
        Columns {
            size_bytes: rows.iter().map(|r| r.size_bytes).collect(),
            count: rows.iter().map(|r| r.count).collect(),
            dtype: rows.iter().map(|r| r.dtype.clone()).collect(),
            op: rows.iter().map(|r| r.op.clone()).collect(),
            root: rows.iter().map(|r| r.root).collect(),
            in_place: rows.iter().map(|r| r.in_place).collect(),
            time_us: rows.iter().map(|r| finite(r.time_us)).collect(),
            algbw_gbs: rows.iter().map(|r| finite(r.algbw_gbs)).collect(),
            busbw_gbs: rows.iter().map(|r| finite(r.busbw_gbs)).collect(),
            wrong: rows.iter().map(|r| r.wrong).collect(),
            labels: rows
                .iter()
                .map(|r| serde_json::to_value(&r.labels).unwrap_or_default())
                .collect(),
            extra: rows
                .iter()
                .map(|r| {
                    if r.extra.is_null() {
                        serde_json::json!({})
                    } else {
                        r.extra.clone()
                    }
                })
                .collect(),
        }
    }
}

/// A stored row as judging reads it back: what `result_rows` keeps of the judged columns
/// (non-finite figures are NULL there), the others left at their defaults.
pub fn as_stored(r: &ResultRow) -> ResultRow {
    let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
    ResultRow {
        size_bytes: r.size_bytes,
        op: r.op.clone(),
        time_us: finite(r.time_us),
        algbw_gbs: finite(r.algbw_gbs),
        busbw_gbs: finite(r.busbw_gbs),
        wrong: r.wrong,
        labels: r.labels.clone(),
        ..Default::default()
    }
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
