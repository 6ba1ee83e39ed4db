//! Observed jobs: the agents' uploads of what NCCL's profiler plugin saw
//! (`POST /agent/observations`) and the jobs people read (`GET /jobs`, `GET /jobs/{id}`).
//! The store is `observed/`, the verdicts `health::observed`.

use axum::extract::State;
use heddle_types::auth::Role;
use heddle_types::observed::{
    ObservationUpload, ObservationsAccepted, ObservedJob, ObservedJobSummary,
};
use uuid::Uuid;

use crate::api::page::{self, Page};
use crate::db;
use crate::health::observed::{judge_job, judge_ranks, ranks::Limits};
use crate::http::auth::{AgentCaller, Caller};
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::observed::store;
use crate::state::AppState;

/// Store the latest state of jobs observed on this agent's node. Idempotent: per process
/// and communicator the highest `seq` is kept. Each job changed is judged before the answer.
#[utoipa::path(post, path = "/api/v1/agent/observations", tag = "agent", security(("agent" = [])),
    request_body = ObservationUpload,
    responses((status = 200, body = ObservationsAccepted), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn upload_observations(
    State(state): State<AppState>,
    agent: AgentCaller,
    Json(upload): Json<ObservationUpload>,
) -> ApiResult<Json<ObservationsAccepted>> {
    let stored = store::store(
        &state.db,
        agent.node_id,
        &upload,
        state.config.observed_jobs_keep,
    )
    .await?;
    if stored.refused > 0 {
        state
            .metrics
            .observed_refused("too-many-rows", u64::from(stored.refused));
    }
    let limits = Limits {
        hung_s: state.config.job_hung_s,
        silent_s: state.config.job_silent_s,
        straggler_ms: state.config.job_straggler_ms,
        ..Limits::default()
    };
    // The observations are stored whatever happens here; a failed judgement is logged and
    // made again by the job's next upload.
    for job_id in &stored.jobs {
        if let Err(err) =
            judge_job(&state.db, *job_id, state.config.job_below_expected_fraction).await
        {
            tracing::warn!(%job_id, error = %err, "judging an observed job failed");
        }
        if let Err(err) = judge_ranks(&state.db, *job_id, &limits).await {
            tracing::warn!(%job_id, error = %err, "judging an observed job's ranks failed");
        }
    }
    Ok(Json(ObservationsAccepted {
        stored: stored.stored,
        unchanged: stored.unchanged,
        refused: stored.refused,
    }))
}

#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct JobFilter {
    /// Only jobs observed on this node (id or hostname).
    node: Option<String>,
    /// Only the job steps of this Slurm job (`SLURM_JOB_ID`), on every node they ran on.
    slurm_job: Option<String>,
    /// Jobs per page (1 to 1000, default 50).
    limit: Option<i64>,
    /// Where the next page starts: the `x-next-cursor` of the previous page.
    cursor: Option<String>,
}

/// Observed jobs, most recently seen first, a page at a time.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "verdicts", security(("bearer" = [])), params(JobFilter),
    responses((status = 200, body = [ObservedJobSummary], headers(("x-next-cursor" = String,
        description = "present when there are more jobs: pass it as `cursor` (with the same filters) for the next page"))),
        (status = 400, body = heddle_types::ErrorBody), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn list_jobs(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<JobFilter>,
) -> ApiResult<Page<ObservedJobSummary>> {
    caller.require(Role::Viewer)?;
    let after = match f.cursor.as_deref().map(page::decode).transpose()? {
        Some(key) => Some(store::parse_list_key(&key).ok_or_else(|| {
            ApiError::BadRequest("cursor is not one this server handed out".into())
        })?),
        None => None,
    };
    let node = match &f.node {
        Some(key) => Some(db::resolve_node(&state.db, key).await?),
        None => None,
    };
    let limit = super::limit(f.limit, 50);
    let rows = store::list(&state.db, node, f.slurm_job.as_deref(), after, limit).await?;
    Ok(Page::of(rows, limit, store::list_key))
}

/// One observed job: its communicators, bandwidth per function and size band, transport
/// and verdict.
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "verdicts", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = ObservedJob), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<ObservedJob>> {
    caller.require(Role::Viewer)?;
    Ok(Json(store::get(&state.db, id).await?))
}
