//! The only code that changes a job row (`UPDATE jobs`). Each function is one move of
//! `state.rs`: its SQL takes jobs only from the move's source states, and every row it
//! moves comes back and is checked with [`Move::check`], so a statement that strays from
//! the table fails (and rolls back where the caller holds a transaction) instead of
//! leaving a job in a state nobody may put it in. The queries are checked against the
//! schema at compile time (`.sqlx/` holds what offline builds need).
//!
//! Every statement is safe when several replicas run it at once: row locks (and
//! `SKIP LOCKED` for claims) decide which replica moves a row; the other's `WHERE` then no
//! longer matches it.

use chrono::{DateTime, Utc};
use heddle_types::jobs::{EnvVar, JobSpec, JobState, Progress};
use sqlx::PgConnection;
use sqlx::types::Json as SqlJson;
use uuid::Uuid;

use super::JobError;
use super::state::{Move, finish_state};

fn parse(state: &str) -> Result<JobState, JobError> {
    state.parse().map_err(|message| JobError::Corrupt {
        what: "job state",
        message,
    })
}

/// Checks rows a statement moved: each left `from` (the one source state its `WHERE`
/// allows, or the state it keeps) for a state the move may reach.
fn moved(m: Move, from: Option<JobState>, to: &str) -> Result<JobState, JobError> {
    let to = parse(to)?;
    let from = from.unwrap_or(to);
    m.check(from, to)?;
    Ok(to)
}

/// A queued job handed to an agent.
pub struct Lease {
    pub id: Uuid,
    pub claim_id: Uuid,
    pub run_id: Uuid,
    pub rank: i32,
    pub world_size: i32,
    pub attempts: i32,
    pub lease_expires_at: DateTime<Utc>,
    /// The run's spec with the job's own environment in place of the run's
    /// (`runs_env::job_spec`).
    pub spec: JobSpec,
}

/// The claimed row as stored: the run's spec and the job's applied environment apart.
struct Claimed {
    id: Uuid,
    claim_id: Uuid,
    run_id: Uuid,
    rank: i32,
    world_size: i32,
    attempts: i32,
    lease_expires_at: DateTime<Utc>,
    state: String,
    spec: SqlJson<JobSpec>,
    applied_env: Option<SqlJson<Vec<EnvVar>>>,
}

/// [`Move::Claim`]: the oldest queued job of `node` (not asked to stop) becomes leased to
/// `agent` under a fresh claim id. `FOR UPDATE SKIP LOCKED` lets any number of replicas
/// claim concurrently without handing one job out twice.
pub async fn claim(
    db: &mut PgConnection,
    node: Uuid,
    agent: Uuid,
    lease_secs: f64,
) -> Result<Option<Lease>, JobError> {
    let claimed = sqlx::query_as!(
        Claimed,
        r#"WITH next AS (
             SELECT id FROM jobs WHERE node_id = $1 AND state = 'queued' AND NOT cancel_requested
             ORDER BY created_at, rank LIMIT 1 FOR UPDATE SKIP LOCKED)
         UPDATE jobs j SET state = 'leased', attempts = j.attempts + 1, lease_agent_id = $2,
                lease_expires_at = now() + make_interval(secs => $3), error = NULL,
                claim_id = $4, claim_agent_id = $2
         FROM next, runs r WHERE j.id = next.id AND r.id = j.run_id
         RETURNING j.id, j.claim_id AS "claim_id!", j.run_id, j.rank, j.world_size, j.attempts,
             j.lease_expires_at AS "lease_expires_at!", j.state, r.spec AS "spec!: SqlJson<JobSpec>",
             j.applied_env AS "applied_env?: SqlJson<Vec<EnvVar>>""#,
        node,
        agent,
        lease_secs,
        Uuid::new_v4(),
    )
    .fetch_optional(db)
    .await?;
    let Some(c) = claimed else {
        return Ok(None);
    };
    moved(Move::Claim, Some(JobState::Queued), &c.state)?;
    Ok(Some(Lease {
        id: c.id,
        claim_id: c.claim_id,
        run_id: c.run_id,
        rank: c.rank,
        world_size: c.world_size,
        attempts: c.attempts,
        lease_expires_at: c.lease_expires_at,
        spec: crate::runs_env::job_spec(c.spec.0, c.applied_env.map(|e| e.0)),
    }))
}

/// [`Move::Heartbeat`], for a batch of heartbeats (`liveness.rs` flushes them): each named
/// job's lease runs to the time of its heartbeat (`seen_age_s` seconds ago) plus
/// `lease_ttl`, never shortened, and only while the job is still leased to that agent.
/// The one place heartbeats renew leases. Returns how many leases were renewed.
pub async fn heartbeat_batch(
    db: &mut PgConnection,
    job_ids: &[Uuid],
    agent_ids: &[Uuid],
    seen_age_s: &[f64],
    lease_ttl: std::time::Duration,
) -> Result<u64, JobError> {
    if job_ids.is_empty() {
        return Ok(0);
    }
    let rows = sqlx::query!(
        "UPDATE jobs SET lease_expires_at = greatest(jobs.lease_expires_at,
                now() - make_interval(secs => r.age) + make_interval(secs => $4))
         FROM unnest($1::uuid[], $2::uuid[], $3::float8[]) AS r(job_id, agent_id, age)
         WHERE jobs.id = r.job_id AND jobs.lease_agent_id = r.agent_id
               AND jobs.state IN ('leased', 'running')
         RETURNING jobs.state",
        job_ids,
        agent_ids,
        seen_age_s,
        lease_ttl.as_secs_f64(),
    )
    .fetch_all(db)
    .await?;
    for r in &rows {
        moved(Move::Heartbeat, None, &r.state)?;
    }
    Ok(rows.len() as u64)
}

/// [`Move::Renew`]: extends the lease `agent` holds on `job` (under `claim`, when named),
/// marks the job running and keeps its progress. Returns the new expiry and whether the
/// job was asked to stop; a lease lost to a newer claim is [`JobError::StaleClaim`], one
/// lost otherwise [`JobError::Conflict`].
pub async fn renew(
    db: &mut PgConnection,
    job: Uuid,
    agent: Uuid,
    claim: Option<Uuid>,
    progress: Option<&Progress>,
    lease_secs: f64,
) -> Result<(DateTime<Utc>, bool), JobError> {
    let progress = progress.map(|p| serde_json::to_value(p).expect("progress serializes"));
    let row = sqlx::query!(
        r#"UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $3), state = 'running',
                started_at = coalesce(started_at, now()), progress = coalesce($4, progress)
         WHERE id = $1 AND lease_agent_id = $2 AND state IN ('leased', 'running')
               AND ($5::uuid IS NULL OR claim_id = $5)
         RETURNING lease_expires_at AS "lease_expires_at!", cancel_requested, state"#,
        job,
        agent,
        lease_secs,
        progress,
        claim,
    )
    .fetch_optional(&mut *db)
    .await?;
    if let Some(r) = row {
        // From leased or running: the WHERE allows both, and both may be renewed.
        moved(Move::Renew, Some(JobState::Leased), &r.state)?;
        return Ok((r.lease_expires_at, r.cancel_requested));
    }
    let exists = sqlx::query!("SELECT state, claim_id FROM jobs WHERE id = $1", job)
        .fetch_optional(db)
        .await?;
    Err(match exists {
        None => JobError::NoJob(job),
        Some(j) if claim.is_some() && j.claim_id != claim => JobError::StaleClaim(format!(
            "lease on job {job} lost: it was claimed again after this claim; stop working on it"
        )),
        Some(j) => JobError::Conflict(format!(
            "lease on job {job} lost: it is {} and not leased to this agent",
            j.state
        )),
    })
}

/// [`Move::Finish`]: ends `job`, now in `current` (read under its row lock by the caller),
/// with its claim's result. Returns the state it ended in.
pub async fn finish(
    tx: &mut PgConnection,
    job: Uuid,
    current: JobState,
    outcome: JobState,
    started_at: DateTime<Utc>,
    reason: Option<&str>,
) -> Result<JobState, JobError> {
    let to = finish_state(current, outcome)?;
    sqlx::query!(
        "UPDATE jobs SET state = $2, finished_at = now(), lease_agent_id = NULL, lease_expires_at = NULL,
                started_at = coalesce(started_at, $3),
                error = CASE WHEN $2 IN ('failed', 'skipped') THEN $4 ELSE error END
         WHERE id = $1",
        job,
        to.as_str(),
        started_at,
        reason,
    )
    .execute(tx)
    .await?;
    Ok(to)
}

/// [`Move::Expire`]: requeues jobs whose lease ran out, fails them after their last
/// attempt, or cancels them when a cancel was asked for. Returns the jobs moved and
/// their new state.
pub async fn expire_leases(
    db: &mut PgConnection,
    margin: std::time::Duration,
) -> Result<Vec<(Uuid, JobState)>, JobError> {
    let rows = sqlx::query!(
        "UPDATE jobs SET
            state = CASE WHEN cancel_requested THEN 'cancelled'
                         WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
            error = CASE WHEN cancel_requested THEN 'cancelled; its agent stopped heartbeating before confirming'
                         WHEN attempts >= max_attempts THEN format('lease expired on attempt %s of %s: the agent stopped heartbeating', attempts, max_attempts)
                         ELSE format('lease expired on attempt %s of %s: the agent stopped heartbeating; requeued', attempts, max_attempts) END,
            finished_at = CASE WHEN cancel_requested OR attempts >= max_attempts THEN now() END,
            lease_agent_id = NULL, lease_expires_at = NULL, progress = NULL
         WHERE state IN ('leased', 'running') AND lease_expires_at < now() - make_interval(secs => $1)
         RETURNING id, state",
        margin.as_secs_f64(),
    )
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok((
                r.id,
                moved(Move::Expire, Some(JobState::Running), &r.state)?,
            ))
        })
        .collect()
}

/// After a gap in the lease clock (nobody could judge leases: the database or every
/// replica was down), every lease granted before the gap — one that expires earlier than
/// the previous tick plus `term` — gets `term` from now: a [`Move::Heartbeat`] on the
/// clock's behalf, the state stays. Returns how many leases were extended.
pub async fn extend_leases_after_gap(
    conn: &mut PgConnection,
    previous_tick: DateTime<Utc>,
    term: std::time::Duration,
) -> Result<u64, JobError> {
    let rows = sqlx::query!(
        "UPDATE jobs SET lease_expires_at = clock_timestamp() + make_interval(secs => $2)
         WHERE state IN ('leased', 'running') AND lease_expires_at < $1::timestamptz + make_interval(secs => $2)
         RETURNING state",
        previous_tick,
        term.as_secs_f64(),
    )
    .fetch_all(conn)
    .await?;
    for r in &rows {
        moved(Move::Heartbeat, None, &r.state)?;
    }
    Ok(rows.len() as u64)
}

/// [`Move::EndLease`]: the leases held by `agents` (revoked or replaced) end now, so the
/// reaper moves their jobs on its next tick. Returns how many leases ended.
pub async fn end_leases_of(tx: &mut PgConnection, agents: &[Uuid]) -> Result<usize, JobError> {
    let rows = sqlx::query!(
        "UPDATE jobs SET lease_expires_at = now()
         WHERE lease_agent_id = ANY($1) AND state IN ('leased', 'running') RETURNING state",
        agents,
    )
    .fetch_all(tx)
    .await?;
    for r in &rows {
        moved(Move::EndLease, None, &r.state)?;
    }
    Ok(rows.len())
}

/// [`Move::Cancel`]: the queued jobs of `runs` end with `why`; their claimed jobs are asked
/// to stop (their agents hear it on the next heartbeat or renewal). Returns the jobs ended.
pub async fn cancel_runs(
    tx: &mut PgConnection,
    runs: &[Uuid],
    why: &str,
) -> Result<usize, JobError> {
    let ended = sqlx::query!(
        "UPDATE jobs SET state = 'cancelled', finished_at = now(), error = $2
         WHERE run_id = ANY($1) AND state = 'queued' RETURNING state",
        runs,
        why,
    )
    .fetch_all(&mut *tx)
    .await?;
    for r in &ended {
        moved(Move::Cancel, Some(JobState::Queued), &r.state)?;
    }
    sqlx::query!(
        "UPDATE jobs SET cancel_requested = true WHERE run_id = ANY($1) AND state IN ('leased', 'running')",
        runs,
    )
    .execute(tx)
    .await?;
    Ok(ended.len())
}

/// [`Move::GiveUp`]: the queued jobs of the running pairs of investigation `inv` that
/// nobody claimed within `deadline_s` end, naming their node; then their runs are
/// cancelled (queued peers end, claimed ones are asked to stop). Returns those runs.
pub async fn give_up_unclaimed(
    tx: &mut PgConnection,
    inv: Uuid,
    deadline_s: i64,
) -> Result<Vec<Uuid>, JobError> {
    let stale = sqlx::query!(
        "UPDATE jobs j SET state = 'cancelled', finished_at = now(),
                error = format('not claimed within %s s: is the agent of %s running?', $2::bigint, n.hostname)
         FROM investigation_pairs p, nodes n
         WHERE p.investigation_id = $1 AND p.state = 'running' AND j.run_id = p.run_id AND n.id = j.node_id
           AND j.state = 'queued' AND j.created_at < now() - make_interval(secs => $2::float8)
         RETURNING j.run_id, j.state",
        inv,
        // Postgres takes $2 as float8 (for make_interval); format() prints it as a bigint.
        deadline_s as f64,
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut runs = Vec::with_capacity(stale.len());
    for r in stale {
        moved(Move::GiveUp, Some(JobState::Queued), &r.state)?;
        runs.push(r.run_id);
    }
    if !runs.is_empty() {
        cancel_runs(tx, &runs, "its peer never started").await?;
    }
    Ok(runs)
}

/// [`Move::GiveUp`] for the queued jobs of `runs` nobody claimed within `deadline_s`, as
/// [`give_up_unclaimed`] does for an investigation's pairs; then their runs are cancelled.
/// Returns those runs.
pub async fn give_up_unclaimed_runs(
    tx: &mut PgConnection,
    runs: &[Uuid],
    deadline_s: i64,
) -> Result<Vec<Uuid>, JobError> {
    let stale = sqlx::query!(
        "UPDATE jobs j SET state = 'cancelled', finished_at = now(),
                error = format('not claimed within %s s: is the agent of %s running?', $2::bigint, n.hostname)
         FROM nodes n
         WHERE j.run_id = ANY($1) AND n.id = j.node_id
           AND j.state = 'queued' AND j.created_at < now() - make_interval(secs => $2::float8)
         RETURNING j.run_id, j.state",
        runs,
        deadline_s as f64,
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut ended = Vec::with_capacity(stale.len());
    for (run, state) in stale.into_iter().map(|r| (r.run_id, r.state)) {
        moved(Move::GiveUp, Some(JobState::Queued), &state)?;
        if !ended.contains(&run) {
            ended.push(run);
        }
    }
    if !ended.is_empty() {
        cancel_runs(tx, &ended, "its peer never started").await?;
    }
    Ok(ended)
}

/// [`Move::Reorder`]: places the (queued) jobs of a new run `micros` microseconds later in
/// their nodes' claim order.
pub async fn reorder(tx: &mut PgConnection, run: Uuid, micros: f64) -> Result<(), JobError> {
    let rows = sqlx::query!(
        "UPDATE jobs SET created_at = created_at + make_interval(secs => $2::float8 / 1e6)
         WHERE run_id = $1 AND state = 'queued' RETURNING state",
        run,
        micros,
    )
    .fetch_all(tx)
    .await?;
    for r in &rows {
        moved(Move::Reorder, Some(JobState::Queued), &r.state)?;
    }
    Ok(())
}
