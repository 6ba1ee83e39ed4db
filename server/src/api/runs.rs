//! Runs (what a person starts) and their jobs (what each agent executes) and results.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use heddle_types::auth::Role;
use heddle_types::collective::canonical_collective;
use heddle_types::jobs::*;
use serde::Deserialize;
use uuid::Uuid;

use crate::AppState;
use crate::auth::Caller;
use crate::db;
use crate::error::{ApiError, ApiResult, Json, Path, Query};

/// Most nodes one run may span.
pub(crate) const MAX_RUN_NODES: usize = 4096;

#[derive(sqlx::FromRow)]
pub(crate) struct JobRow {
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

const JOB_SELECT: &str = "SELECT j.id, j.run_id, j.node_id, n.hostname, j.rank, j.world_size, j.state, j.attempts,
    j.max_attempts, j.lease_expires_at, j.cancel_requested, j.error, j.progress, j.created_at, j.started_at,
    j.finished_at, j.applied_env FROM jobs j JOIN nodes n ON n.id = j.node_id";

impl TryFrom<JobRow> for Job {
    type Error = ApiError;
    fn try_from(r: JobRow) -> Result<Self, ApiError> {
        Ok(Job {
            id: r.id,
            run_id: r.run_id,
            node_id: r.node_id,
            hostname: r.hostname,
            rank: r.rank,
            world_size: r.world_size,
            state: r
                .state
                .parse()
                .map_err(|e: String| ApiError::Internal(anyhow::anyhow!(e)))?,
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

/// A run's state from its jobs' states.
fn run_state(jobs: &[Job]) -> &'static str {
    let any = |s: JobState| jobs.iter().any(|j| j.state == s);
    if jobs.iter().any(|j| !j.state.is_terminal()) {
        if any(JobState::Leased) || any(JobState::Running) {
            "running"
        } else {
            "queued"
        }
    } else if any(JobState::Failed) {
        "failed"
    } else if any(JobState::Cancelled) {
        "cancelled"
    } else if !jobs.is_empty() && jobs.iter().all(|j| j.state == JobState::Skipped) {
        "skipped"
    } else {
        "succeeded"
    }
}

/// Kinds whose `op` parameter names an NCCL collective.
const COLLECTIVE_KINDS: [&str; 3] = ["nccl", "sweep", "rdma_ab"];

/// Checks a job spec and puts its collective name in the one spelling that results,
/// verdicts and expectations use (`allreduce` becomes `all_reduce`).
pub(crate) fn validate_spec(spec: &mut JobSpec) -> Result<(), ApiError> {
    let kind_ok = !spec.kind.is_empty()
        && spec.kind.len() <= 64
        && spec
            .kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !kind_ok {
        return Err(ApiError::Unprocessable(format!(
            "kind {:?} must be 1-64 letters, digits, '_', '-' or '.'",
            spec.kind
        )));
    }
    if !(spec.params.is_object() || spec.params.is_null()) {
        return Err(ApiError::Unprocessable(
            "params must be a JSON object".into(),
        ));
    }
    if COLLECTIVE_KINDS.contains(&spec.kind.as_str())
        && let Some(op) = spec.params.get_mut("op")
    {
        let name = op.as_str().ok_or_else(|| {
            ApiError::Unprocessable("params.op must be a collective's name".into())
        })?;
        *op = canonical_collective(name)
            .map_err(|e| ApiError::Unprocessable(format!("params.op: {e}")))?
            .into();
    }
    db::check_env(&spec.env)?;
    check_sweep_grid(spec)?;
    if spec.timeout_s == Some(0) {
        return Err(ApiError::Unprocessable(
            "timeout_s must be at least 1".into(),
        ));
    }
    Ok(())
}

/// A sweep's grid sets variables too, one cell at a time: each name and each value must
/// pass the same policy as a run's env. (Its shape is the agent's to check.)
fn check_sweep_grid(spec: &JobSpec) -> Result<(), ApiError> {
    use heddle_types::env_policy::{check_name, check_value};
    if spec.kind != "sweep" {
        return Ok(());
    }
    let Some(grid) = spec.params.get("grid").and_then(|g| g.as_object()) else {
        return Ok(());
    };
    for (name, values) in grid {
        check_name(name)?;
        for v in values.as_array().into_iter().flatten() {
            if let Some(text) = v.as_str() {
                check_value(name, text)?;
            }
        }
    }
    Ok(())
}

async fn load_run(db: &sqlx::PgPool, id: Uuid) -> ApiResult<Run> {
    let row: Option<(
        Uuid,
        Option<String>,
        sqlx::types::Json<JobSpec>,
        String,
        DateTime<Utc>,
    )> = sqlx::query_as("SELECT id, label, spec, created_by, created_at FROM runs WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    let (id, label, spec, created_by, created_at) =
        row.ok_or_else(|| ApiError::NotFound(format!("no run {id}")))?;
    let jobs: Vec<JobRow> =
        sqlx::query_as(&format!("{JOB_SELECT} WHERE j.run_id = $1 ORDER BY j.rank"))
            .bind(id)
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
        state: run_state(&jobs).to_string(),
        created_by,
        created_at,
        finished_at,
        jobs,
    })
}

/// Stores a run of `spec` and one queued job per node, ranked in the order given, inside
/// the caller's transaction (which also writes the audit entry). `spec` is validated and
/// `nodes` resolved, distinct and at most `MAX_RUN_NODES` long. Each job gets its node's
/// environment under the spec's (`runs_env`), unless `recommended_env` is false.
pub(crate) async fn insert_run(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    spec: &JobSpec,
    node_ids: &[Uuid],
    max_attempts: u32,
    label: Option<&str>,
    actor: &str,
    recommended_env: bool,
) -> Result<Uuid, sqlx::Error> {
    let mut applied = Vec::with_capacity(node_ids.len());
    for node in node_ids {
        let env = crate::runs_env::applied(tx, *node, &spec.env, recommended_env).await?;
        applied.push(serde_json::to_value(env).expect("env serializes"));
    }
    let run_id = Uuid::new_v4();
    sqlx::query("INSERT INTO runs (id, label, spec, created_by) VALUES ($1, $2, $3, $4)")
        .bind(run_id)
        .bind(label)
        .bind(sqlx::types::Json(spec))
        .bind(actor)
        .execute(&mut **tx)
        .await?;
    let world = i32::try_from(node_ids.len()).expect("bounded by MAX_RUN_NODES");
    let ids: Vec<Uuid> = node_ids.iter().map(|_| Uuid::new_v4()).collect();
    let ranks: Vec<i32> = (0..world).collect();
    sqlx::query(
        "INSERT INTO jobs (id, run_id, node_id, rank, world_size, state, max_attempts, applied_env)
         SELECT id, $2, node_id, rank, $3, 'queued', $4, env
         FROM unnest($1::uuid[], $5::uuid[], $6::int[], $7::jsonb[]) AS t(id, node_id, rank, env)",
    )
    .bind(&ids)
    .bind(run_id)
    .bind(world)
    .bind(i32::try_from(max_attempts).expect("at most 100"))
    .bind(node_ids)
    .bind(&ranks)
    .bind(&applied)
    .execute(&mut **tx)
    .await?;
    Ok(run_id)
}

/// Start a run: one job per node, ranked in the order given.
#[utoipa::path(post, path = "/api/v1/runs", tag = "runs", security(("bearer" = [])), request_body = RunCreate,
    responses((status = 201, body = Run), (status = 404, body = heddle_types::ErrorBody), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn create_run(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<RunCreate>,
) -> ApiResult<(StatusCode, Json<Run>)> {
    caller.require(Role::Operator)?;
    let mut spec = req.spec();
    validate_spec(&mut spec)?;
    if req.nodes.is_empty() || req.nodes.len() > MAX_RUN_NODES {
        return Err(ApiError::Unprocessable(format!(
            "nodes must list 1 to {MAX_RUN_NODES} nodes"
        )));
    }
    let max_attempts = req.max_attempts.unwrap_or(3);
    if !(1..=100).contains(&max_attempts) {
        return Err(ApiError::Unprocessable(
            "max_attempts must be between 1 and 100".into(),
        ));
    }
    let mut tx = state.db.begin().await?;
    let mut node_ids = Vec::with_capacity(req.nodes.len());
    for key in &req.nodes {
        let id = db::resolve_node(&mut *tx, key).await?;
        if node_ids.contains(&id) {
            return Err(ApiError::Unprocessable(format!(
                "node {key:?} is listed twice"
            )));
        }
        node_ids.push(id);
    }
    let run_id = insert_run(
        &mut tx,
        &spec,
        &node_ids,
        max_attempts,
        req.label.as_deref(),
        &caller.actor(),
        req.recommended_env.unwrap_or(true),
    )
    .await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "run.create",
        &format!("run:{run_id}"),
        serde_json::json!({"kind": spec.kind, "nodes": req.nodes, "recommended_env": req.recommended_env.unwrap_or(true)}),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(load_run(&state.db, run_id).await?),
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RunFilter {
    /// Runs with a job on this node (id or hostname).
    node: Option<String>,
    kind: Option<String>,
    limit: Option<i64>,
}

/// Recent runs, newest first.
#[utoipa::path(get, path = "/api/v1/runs", tag = "runs", security(("bearer" = [])), params(RunFilter),
    responses((status = 200, body = [Run])))]
pub async fn list_runs(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<RunFilter>,
) -> ApiResult<Json<Vec<Run>>> {
    caller.require(Role::Viewer)?;
    let node = match &f.node {
        Some(key) => Some(db::resolve_node(&state.db, key).await?),
        None => None,
    };
    let ids: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT r.id FROM runs r
         WHERE ($1::uuid IS NULL OR EXISTS (SELECT 1 FROM jobs j WHERE j.run_id = r.id AND j.node_id = $1))
           AND ($2::text IS NULL OR r.spec->>'kind' = $2)
         ORDER BY r.created_at DESC LIMIT $3",
    )
    .bind(node)
    .bind(f.kind)
    .bind(super::limit(f.limit, 50))
    .fetch_all(&state.db)
    .await?;
    let mut runs = Vec::with_capacity(ids.len());
    for (id,) in ids {
        runs.push(load_run(&state.db, id).await?);
    }
    Ok(Json(runs))
}

#[utoipa::path(get, path = "/api/v1/runs/{id}", tag = "runs", security(("bearer" = [])), params(("id" = Uuid, Path)),
    responses((status = 200, body = Run), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<Run>> {
    caller.require(Role::Viewer)?;
    Ok(Json(load_run(&state.db, id).await?))
}

/// Cancel a run: queued jobs end at once, running ones are told to stop by their agents'
/// next heartbeat or lease renewal.
#[utoipa::path(post, path = "/api/v1/runs/{id}/cancel", tag = "runs", security(("bearer" = [])), params(("id" = Uuid, Path)),
    responses((status = 200, body = Run), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn cancel_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<Run>> {
    caller.require(Role::Operator)?;
    let mut tx = state.db.begin().await?;
    let exists: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM runs WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    if exists.is_none() {
        return Err(ApiError::NotFound(format!("no run {id}")));
    }
    sqlx::query(
        "UPDATE jobs SET state = 'cancelled', finished_at = now(), error = 'cancelled before it started'
         WHERE run_id = $1 AND state = 'queued'",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE jobs SET cancel_requested = true WHERE run_id = $1 AND state IN ('leased', 'running')")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "run.cancel",
        &format!("run:{id}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok(Json(load_run(&state.db, id).await?))
}

#[derive(sqlx::FromRow)]
struct ResultRowDb {
    id: Uuid,
    job_id: Uuid,
    node_id: Uuid,
    hostname: String,
    outcome: String,
    reason: Option<String>,
    exit_code: Option<i32>,
    stderr_tail: Option<String>,
    summary: serde_json::Value,
    started_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
    received_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct MeasureRow {
    result_id: Uuid,
    size_bytes: i64,
    count: Option<i64>,
    dtype: Option<String>,
    op: Option<String>,
    root: Option<i32>,
    in_place: Option<bool>,
    time_us: Option<f64>,
    algbw_gbs: Option<f64>,
    busbw_gbs: Option<f64>,
    wrong: Option<i64>,
    labels: sqlx::types::Json<std::collections::BTreeMap<String, String>>,
    extra: serde_json::Value,
}

/// Results of a run's jobs with their measured rows.
#[utoipa::path(get, path = "/api/v1/runs/{id}/results", tag = "runs", security(("bearer" = [])), params(("id" = Uuid, Path)),
    responses((status = 200, body = [JobResult]), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn run_results(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<Vec<JobResult>>> {
    caller.require(Role::Viewer)?;
    let exists: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM runs WHERE id = $1")
        .bind(id)
        .fetch_optional(&state.db)
        .await?;
    if exists.is_none() {
        return Err(ApiError::NotFound(format!("no run {id}")));
    }
    let results: Vec<ResultRowDb> = sqlx::query_as(
        "SELECT r.id, r.job_id, j.node_id, n.hostname, r.outcome, r.reason, r.exit_code, r.stderr_tail, r.summary,
                r.started_at, r.finished_at, r.received_at
         FROM results r JOIN jobs j ON j.id = r.job_id JOIN nodes n ON n.id = j.node_id
         WHERE j.run_id = $1 ORDER BY j.rank",
    )
    .bind(id)
    .fetch_all(&state.db)
    .await?;
    let ids: Vec<Uuid> = results.iter().map(|r| r.id).collect();
    let rows: Vec<MeasureRow> = sqlx::query_as(
        "SELECT result_id, size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs, busbw_gbs, wrong, labels, extra
         FROM result_rows WHERE result_id = ANY($1) ORDER BY result_id, seq",
    )
    .bind(&ids)
    .fetch_all(&state.db)
    .await?;
    let mut verdicts = crate::health::store::for_results(&state.db, &ids).await?;
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        let outcome = match r.outcome.as_str() {
            "succeeded" => Outcome::Succeeded,
            "failed" => Outcome::Failed,
            "skipped" => Outcome::Skipped,
            _ => Outcome::Cancelled,
        };
        let mine = rows
            .iter()
            .filter(|m| m.result_id == r.id)
            .map(|m| ResultRow {
                size_bytes: m.size_bytes,
                count: m.count,
                dtype: m.dtype.clone(),
                op: m.op.clone(),
                root: m.root,
                in_place: m.in_place,
                time_us: m.time_us,
                algbw_gbs: m.algbw_gbs,
                busbw_gbs: m.busbw_gbs,
                wrong: m.wrong,
                labels: m.labels.0.clone(),
                extra: m.extra.clone(),
            })
            .collect();
        out.push(JobResult {
            id: r.id,
            job_id: r.job_id,
            node_id: r.node_id,
            hostname: r.hostname,
            outcome,
            reason: r.reason,
            exit_code: r.exit_code,
            stderr_tail: r.stderr_tail,
            summary: r.summary,
            rows: mine,
            started_at: r.started_at,
            finished_at: r.finished_at,
            received_at: r.received_at,
            verdict: verdicts.remove(&r.id),
        });
    }
    Ok(Json(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: JobState) -> Job {
        Job {
            id: Uuid::nil(),
            run_id: Uuid::nil(),
            node_id: Uuid::nil(),
            hostname: "h".into(),
            rank: 0,
            world_size: 1,
            state,
            attempts: 0,
            max_attempts: 3,
            lease_expires_at: None,
            cancel_requested: false,
            error: None,
            progress: None,
            created_at: Utc::now(),
            started_at: None,
            finished_at: None,
            applied_env: Vec::new(),
        }
    }

    #[test]
    fn run_state_follows_jobs() {
        use JobState::*;
        let s =
            |states: &[JobState]| run_state(&states.iter().map(|s| job(*s)).collect::<Vec<_>>());
        assert_eq!(s(&[Queued, Queued]), "queued");
        assert_eq!(s(&[Queued, Running]), "running");
        assert_eq!(s(&[Succeeded, Leased]), "running");
        assert_eq!(s(&[Succeeded, Succeeded]), "succeeded");
        assert_eq!(s(&[Succeeded, Skipped]), "succeeded");
        assert_eq!(s(&[Skipped, Skipped]), "skipped");
        assert_eq!(s(&[Succeeded, Failed, Cancelled]), "failed");
        assert_eq!(s(&[Succeeded, Cancelled]), "cancelled");
    }

    #[test]
    fn specs_are_checked() {
        let spec = |kind: &str, params: serde_json::Value| JobSpec {
            kind: kind.into(),
            params,
            env: Default::default(),
            timeout_s: None,
        };
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({}))).is_ok());
        assert!(validate_spec(&mut spec("", serde_json::json!({}))).is_err());
        assert!(validate_spec(&mut spec("a b", serde_json::json!({}))).is_err());
        assert!(validate_spec(&mut spec("nccl", serde_json::json!([1]))).is_err());
        let mut bad_env = spec("nccl", serde_json::Value::Null);
        bad_env.env.insert("NOT-OK".into(), "1".into());
        assert!(validate_spec(&mut bad_env).is_err());
        let mut alias = spec("nccl", serde_json::json!({"op": "allreduce"}));
        validate_spec(&mut alias).unwrap();
        assert_eq!(alias.params["op"], "all_reduce");
        let mut sweep = spec("sweep", serde_json::json!({"op": "All-Gather"}));
        validate_spec(&mut sweep).unwrap();
        assert_eq!(sweep.params["op"], "all_gather");
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({"op": "gossip"}))).is_err());
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({"op": 3}))).is_err());
        // Other kinds keep their own `op` untouched.
        let mut ucx = spec("ucx", serde_json::json!({"op": "tag_bw"}));
        validate_spec(&mut ucx).unwrap();
        assert_eq!(ucx.params["op"], "tag_bw");
    }
}
