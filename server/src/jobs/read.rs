//! Runs and results as the API lists them: a page of run ids, a page of a run's results
//! with their measured rows. Reads only; the verdicts are `health::store`'s.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use heddle_types::jobs::{JobResult, JobSpec, Outcome};
use heddle_types::rows::ResultRow;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

/// Which runs a page lists: those with a job on `node`, of `kind`, older than `before`
/// (a run's creation time and id, the key pages are cut on).
pub struct RunFilter<'a> {
    pub node: Option<Uuid>,
    pub kind: Option<&'a str>,
    pub before: Option<(DateTime<Utc>, Uuid)>,
}

/// Up to `limit` runs' ids and creation times, newest first.
pub async fn run_ids(
    db: &PgPool,
    f: &RunFilter<'_>,
    limit: i64,
) -> sqlx::Result<Vec<(Uuid, DateTime<Utc>)>> {
    let (before_at, before_id) = f.before.unzip();
    let rows = sqlx::query!(
        "SELECT r.id, r.created_at FROM runs r
         WHERE ($1::uuid IS NULL OR EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.id AND j.node_id = $1))
           AND ($2::text IS NULL OR r.spec->>'kind' = $2)
           AND ($4::timestamptz IS NULL OR (r.created_at, r.id) < ($4, $5))
         ORDER BY r.created_at DESC, r.id DESC LIMIT $3",
        f.node,
        f.kind,
        limit,
        before_at,
        before_id,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.created_at)).collect())
}

pub async fn run_exists(db: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    let found = sqlx::query_scalar!("SELECT id FROM runs WHERE id = $1", id)
        .fetch_optional(db)
        .await?;
    Ok(found.is_some())
}

/// Up to `limit` of the run's results after rank `after_rank`, by rank, each with its
/// rank and measured rows; their verdicts are left empty for the caller.
pub async fn results(
    db: &PgPool,
    run: Uuid,
    after_rank: Option<i32>,
    limit: i64,
) -> sqlx::Result<Vec<(i32, JobResult)>> {
    let results = sqlx::query!(
        "SELECT r.id, r.job_id, j.rank, j.node_id, n.hostname, r.outcome, r.reason, r.exit_code,
                r.stderr_tail, r.summary, r.started_at, r.finished_at, r.received_at
         FROM results r JOIN jobs j ON j.id = r.job_id JOIN nodes n ON n.id = j.node_id
         WHERE j.run_id = $1 AND ($3::int IS NULL OR j.rank > $3) ORDER BY j.rank LIMIT $2",
        run,
        limit,
        after_rank,
    )
    .fetch_all(db)
    .await?;
    let ids: Vec<Uuid> = results.iter().map(|r| r.id).collect();
    let rows = sqlx::query!(
        r#"SELECT result_id, size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs,
                busbw_gbs, wrong, labels AS "labels: Json<BTreeMap<String, String>>", extra
         FROM result_rows WHERE result_id = ANY($1) ORDER BY result_id, seq"#,
        &ids,
    )
    .fetch_all(db)
    .await?;
    let mut by_result: BTreeMap<Uuid, Vec<ResultRow>> = BTreeMap::new();
    for m in rows {
        by_result.entry(m.result_id).or_default().push(ResultRow {
            size_bytes: m.size_bytes,
            count: m.count,
            dtype: m.dtype,
            op: m.op,
            root: m.root,
            in_place: m.in_place,
            time_us: m.time_us,
            algbw_gbs: m.algbw_gbs,
            busbw_gbs: m.busbw_gbs,
            wrong: m.wrong,
            labels: m.labels.0,
            extra: m.extra,
        });
    }
    Ok(results
        .into_iter()
        .map(|r| {
            let outcome = match r.outcome.as_str() {
                "succeeded" => Outcome::Succeeded,
                "failed" => Outcome::Failed,
                "skipped" => Outcome::Skipped,
                _ => Outcome::Cancelled,
            };
            let result = JobResult {
                id: r.id,
                job_id: r.job_id,
                node_id: r.node_id,
                hostname: r.hostname,
                outcome,
                reason: r.reason,
                exit_code: r.exit_code,
                stderr_tail: r.stderr_tail,
                summary: r.summary,
                rows: by_result.remove(&r.id).unwrap_or_default(),
                started_at: r.started_at,
                finished_at: r.finished_at,
                received_at: r.received_at,
                verdict: None,
            };
            (r.rank, result)
        })
        .collect())
}

/// What a heartbeat that cannot be answered from memory reads, in one statement: the
/// node's stored facts hash and job environment version, and of the jobs the agent named,
/// those still leased to it (`leased`) and those it should go on running (`keep`: not
/// asked to stop).
pub struct HeartbeatView {
    pub facts_sha256: Option<String>,
    pub job_env_sha256: Option<String>,
    pub leased: Vec<Uuid>,
    pub keep: Vec<Uuid>,
}

pub async fn heartbeat_view(
    conn: &mut sqlx::PgConnection,
    node: Uuid,
    agent: Uuid,
    named: &[Uuid],
) -> sqlx::Result<HeartbeatView> {
    sqlx::query_as!(
        HeartbeatView,
        r#"SELECT n.facts_sha256, n.job_env_sha256,
                coalesce(j.leased, '{}') AS "leased!", coalesce(j.keep, '{}') AS "keep!"
         FROM nodes n LEFT JOIN LATERAL (
             SELECT array_agg(id) AS leased, array_agg(id) FILTER (WHERE NOT cancel_requested) AS keep
             FROM jobs WHERE id = ANY($2) AND lease_agent_id = $3 AND state IN ('leased', 'running')
         ) j ON true
         WHERE n.id = $1"#,
        node,
        named,
        agent,
    )
    .fetch_one(conn)
    .await
}

/// A run's spec as stored; `None` when there is no such run.
pub async fn run_spec(db: &PgPool, id: Uuid) -> sqlx::Result<Option<JobSpec>> {
    let spec = sqlx::query_scalar!(
        r#"SELECT spec AS "spec: Json<JobSpec>" FROM runs WHERE id = $1"#,
        id
    )
    .fetch_optional(db)
    .await?;
    Ok(spec.map(|s| s.0))
}

/// A run's first rank: its node, the job's state and its result's outcome if it has one.
pub struct FirstJob {
    pub node_id: Uuid,
    pub hostname: String,
    pub site_id: Option<Uuid>,
    pub state: String,
    pub result_id: Option<Uuid>,
    pub outcome: Option<String>,
    pub reason: Option<String>,
}

pub async fn first_job(db: &PgPool, run: Uuid) -> sqlx::Result<Option<FirstJob>> {
    sqlx::query_as!(
        FirstJob,
        r#"SELECT j.node_id, n.hostname, n.site_id, j.state, r.id AS "result_id?",
                r.outcome AS "outcome?", r.reason
         FROM jobs j JOIN nodes n ON n.id = j.node_id LEFT JOIN results r ON r.job_id = j.id
         WHERE j.run_id = $1 ORDER BY j.rank LIMIT 1"#,
        run,
    )
    .fetch_optional(db)
    .await
}

/// A result's measured rows in order, with the columns a sweep's table reads (size,
/// bus bandwidth, wrong values, labels); the rest are left at their defaults.
pub async fn sweep_rows(db: &PgPool, result_id: Uuid) -> sqlx::Result<Vec<ResultRow>> {
    let rows = sqlx::query!(
        r#"SELECT size_bytes, busbw_gbs, wrong, labels AS "labels: Json<BTreeMap<String, String>>"
         FROM result_rows WHERE result_id = $1 ORDER BY seq"#,
        result_id,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| ResultRow {
            size_bytes: r.size_bytes,
            busbw_gbs: r.busbw_gbs,
            wrong: r.wrong,
            labels: r.labels.0,
            ..Default::default()
        })
        .collect())
}
