//! Creating and reading runs: a run and one queued job per node, ranked in the order given.

use chrono::{DateTime, Utc};
use heddle_types::jobs::{EnvVar, Job, JobSpec, Progress, Run, RunState};
use sqlx::PgConnection;
use uuid::Uuid;

use super::JobError;
use crate::db;

/// Most nodes one run may span.
pub const MAX_RUN_NODES: usize = 4096;

struct JobRow {
    id: Uuid,
    run_id: Uuid,
    node_id: Uuid,
    hostname: String,
    rank: i32,
    world_size: i32,
    state: String,
    attempts: i32,
    max_attempts: i32,
    lease_expires_at: Option<DateTime<Utc>>,
    cancel_requested: bool,
    error: Option<String>,
    progress: Option<sqlx::types::Json<Progress>>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    applied_env: Option<sqlx::types::Json<Vec<EnvVar>>>,
}

impl TryFrom<JobRow> for Job {
    type Error = JobError;
    fn try_from(r: JobRow) -> Result<Self, JobError> {
        Ok(Job {
            id: r.id,
            run_id: r.run_id,
            node_id: r.node_id,
            hostname: r.hostname,
            rank: r.rank,
            world_size: r.world_size,
            state: r.state.parse().map_err(|message| JobError::Corrupt {
                what: "job state",
                message,
            })?,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            lease_expires_at: r.lease_expires_at,
            cancel_requested: r.cancel_requested,
            error: r.error,
            progress: r.progress.map(|p| p.0),
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            applied_env: r.applied_env.map(|e| e.0).unwrap_or_default(),
        })
    }
}

/// A run with its jobs, ranked.
pub async fn load_run(db: &sqlx::PgPool, id: Uuid) -> Result<Run, JobError> {
    let run = sqlx::query!(
        r#"SELECT id, label, spec AS "spec: sqlx::types::Json<JobSpec>", created_by, created_at
         FROM runs WHERE id = $1"#,
        id,
    )
    .fetch_optional(db)
    .await?
    .ok_or(JobError::NoRun(id))?;
    let (id, label, spec, created_by, created_at) =
        (run.id, run.label, run.spec, run.created_by, run.created_at);
    let jobs = sqlx::query_as!(
        JobRow,
        r#"SELECT j.id, j.run_id, j.node_id, n.hostname, j.rank, j.world_size, j.state, j.attempts,
                j.max_attempts, j.lease_expires_at, j.cancel_requested, j.error,
                j.progress AS "progress: sqlx::types::Json<Progress>", j.created_at, j.started_at,
                j.finished_at, j.applied_env AS "applied_env: sqlx::types::Json<Vec<EnvVar>>"
         FROM jobs j JOIN nodes n ON n.id = j.node_id WHERE j.run_id = $1 ORDER BY j.rank"#,
        id,
    )
    .fetch_all(db)
    .await?;
    let jobs: Vec<Job> = jobs
        .into_iter()
        .map(TryInto::try_into)
        .collect::<Result<_, _>>()?;
    let finished_at = if jobs.iter().all(|j| j.state.is_terminal()) {
        jobs.iter().filter_map(|j| j.finished_at).max()
    } else {
        None
    };
    Ok(Run {
        id,
        label,
        spec: spec.0,
        state: RunState::of(jobs.iter().map(|j| j.state)),
        created_by,
        created_at,
        finished_at,
        jobs,
    })
}

/// Stores a run and one queued job per node, ranked in the order given, with its
/// `run.create` audit entry, inside the caller's transaction. Each job gets its node's
/// environment under the spec's (`runs_env`), unless `recommended_env` is false.
pub async fn insert_run(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    new: &NewRun<'_>,
) -> Result<Uuid, JobError> {
    let NewRun { spec, nodes, .. } = *new;
    let applied: Vec<serde_json::Value> = agreed_env(tx, spec, nodes, new.recommended_env)
        .await?
        .into_iter()
        .map(|env| serde_json::to_value(env).expect("env serializes"))
        .collect();
    let run_id = Uuid::new_v4();
    sqlx::query!(
        "INSERT INTO runs (id, label, spec, created_by) VALUES ($1, $2, $3, $4)",
        run_id,
        new.label,
        serde_json::to_value(spec).expect("spec serializes"),
        new.actor,
    )
    .execute(&mut **tx)
    .await?;
    let world = i32::try_from(nodes.len()).expect("bounded by MAX_RUN_NODES");
    let ids: Vec<Uuid> = nodes.iter().map(|_| Uuid::new_v4()).collect();
    let ranks: Vec<i32> = (0..world).collect();
    sqlx::query!(
        "INSERT INTO jobs (id, run_id, node_id, rank, world_size, state, max_attempts, applied_env)
         SELECT id, $2, node_id, rank, $3, 'queued', $4, env
         FROM unnest($1::uuid[], $5::uuid[], $6::int[], $7::jsonb[]) AS t(id, node_id, rank, env)",
        &ids,
        run_id,
        world,
        i32::try_from(new.max_attempts).expect("at most 100"),
        nodes,
        &ranks,
        &applied,
    )
    .execute(&mut **tx)
    .await?;
    let mut detail = new.audit.clone();
    if let Some(obj) = detail.as_object_mut() {
        obj.insert("kind".into(), spec.kind.clone().into());
    }
    db::audit(
        &mut **tx,
        new.actor,
        "run.create",
        &format!("run:{run_id}"),
        detail,
    )
    .await?;
    Ok(run_id)
}

/// Each node's environment for a run of `spec` (`runs_env`), in the order of `nodes`,
/// refused with [`JobError::EnvSplit`] when the nodes would disagree on a variable that
/// every rank of one communicator must see alike (`heddle_types::must_agree`). The run's
/// own `env` is on top of every node's, so a variable it sets never splits.
pub async fn agreed_env(
    conn: &mut PgConnection,
    spec: &JobSpec,
    nodes: &[Uuid],
    recommended: bool,
) -> Result<Vec<Vec<EnvVar>>, JobError> {
    let mut envs = Vec::with_capacity(nodes.len());
    for node in nodes {
        let env = crate::runs_env::applied(&mut *conn, *node, &spec.env, recommended).await?;
        crate::runs_env::check_size(&env)?;
        envs.push(env);
    }
    if nodes.len() > 1 {
        let names = sqlx::query!("SELECT id, hostname FROM nodes WHERE id = ANY($1)", nodes)
            .fetch_all(&mut *conn)
            .await?;
        let host = |id: &Uuid| {
            names
                .iter()
                .find(|n| n.id == *id)
                .map_or_else(|| id.to_string(), |n| n.hostname.clone())
        };
        let hosts: Vec<String> = nodes.iter().map(host).collect();
        heddle_types::must_agree::check(
            hosts
                .iter()
                .map(String::as_str)
                .zip(envs.iter().map(Vec::as_slice)),
        )?;
    }
    Ok(envs)
}

/// Resolves the nodes of a new run (ids or hostnames) in the order given, refusing a node
/// listed twice.
pub async fn resolve_run_nodes(
    db: &mut PgConnection,
    keys: &[String],
) -> Result<Vec<Uuid>, JobError> {
    let mut ids = Vec::with_capacity(keys.len());
    for key in keys {
        let id = db::resolve_node(&mut *db, key).await?;
        if ids.contains(&id) {
            return Err(JobError::Invalid(format!("node {key:?} is listed twice")));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// What a new run executes, where, and on whose behalf.
pub struct NewRun<'a> {
    /// Already checked by [`super::validate_spec`].
    pub spec: &'a JobSpec,
    /// Resolved and distinct ([`resolve_run_nodes`]); one job each, ranked in this order.
    pub nodes: &'a [Uuid],
    pub max_attempts: u32,
    pub label: Option<&'a str>,
    pub actor: &'a str,
    /// Each job gets its node's environment under the spec's (`runs_env`); `false` gives
    /// it the spec's only.
    pub recommended_env: bool,
    /// Extra fields of the `run.create` audit entry (besides the kind).
    pub audit: serde_json::Value,
}

/// Cancels run `id` on behalf of `actor`: queued jobs end at once, claimed ones are asked
/// to stop; in one transaction with its audit entry.
pub async fn cancel_run(db: &sqlx::PgPool, id: Uuid, actor: &str) -> Result<(), JobError> {
    let mut tx = db.begin().await?;
    let exists = sqlx::query_scalar!("SELECT id FROM runs WHERE id = $1 FOR UPDATE", id)
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Err(JobError::NoRun(id));
    }
    super::store::cancel_runs(&mut tx, &[id], "cancelled before it started").await?;
    db::audit(
        &mut *tx,
        actor,
        "run.cancel",
        &format!("run:{id}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
