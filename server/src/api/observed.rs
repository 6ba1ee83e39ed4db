//! Observed workloads: the agents' uploads of what NCCL's profiler plugin saw
//! (`POST /agent/observations`) and the workloads people read (`GET /workloads`,
//! `GET /workloads/{id}`; `GET /jobs` and `GET /jobs/{id}` are their deprecated first
//! names). The store is `observed/`, the verdicts `health::observed`.

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use heddle_types::auth::Role;
use heddle_types::observed::{ObservationUpload, ObservationsAccepted, Workload, WorkloadSummary};
use uuid::Uuid;

use crate::api::page::{self, Page};
use crate::db;
use crate::health::observed::{judge_job, judge_ranks, ranks::Limits};
use crate::http::auth::{AgentCaller, Caller};
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::observed::store;
use crate::state::AppState;

/// Store the latest state of workloads observed on this agent's node. Idempotent: per
/// process and communicator the highest `seq` is kept. Each workload changed is judged
/// before the answer.
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
    // made again by the workload's next upload.
    for job_id in &stored.jobs {
        if let Err(err) =
            judge_job(&state.db, *job_id, state.config.job_below_expected_fraction).await
        {
            tracing::warn!(%job_id, error = %err, "judging an observed workload failed");
        }
        if let Err(err) = judge_ranks(&state.db, *job_id, &limits).await {
            tracing::warn!(%job_id, error = %err, "judging an observed workload's ranks failed");
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
pub struct WorkloadFilter {
    /// Only workloads observed on this node (id or hostname).
    node: Option<String>,
    /// Only the job steps of this Slurm job (`SLURM_JOB_ID`), on every node they ran on.
    slurm_job: Option<String>,
    /// Workloads per page (1 to 1000, default 50).
    limit: Option<i64>,
    /// Where the next page starts: the `x-next-cursor` of the previous page.
    cursor: Option<String>,
}

/// Observed workloads, most recently seen first, a page at a time.
#[utoipa::path(get, path = "/api/v1/workloads", tag = "verdicts", security(("bearer" = [])), params(WorkloadFilter),
    responses((status = 200, body = [WorkloadSummary], headers(("x-next-cursor" = String,
        description = "present when there are more workloads: pass it as `cursor` (with the same filters) for the next page"))),
        (status = 400, body = heddle_types::ErrorBody), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn list_workloads(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<WorkloadFilter>,
) -> ApiResult<Page<WorkloadSummary>> {
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

/// One observed workload: its communicators, bandwidth per function and size band,
/// transport, ranks and verdict.
#[utoipa::path(get, path = "/api/v1/workloads/{id}", tag = "verdicts", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = Workload), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_workload(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<Workload>> {
    caller.require(Role::Viewer)?;
    Ok(Json(store::get(&state.db, id).await?))
}

/// The first name of `GET /api/v1/workloads`, answered the same, with the deprecation
/// headers of [`deprecated_alias`].
#[deprecated = "GET /api/v1/workloads"]
#[utoipa::path(get, path = "/api/v1/jobs", tag = "verdicts", security(("bearer" = [])), params(WorkloadFilter),
    responses((status = 200, body = [WorkloadSummary], headers(("x-next-cursor" = String,
        description = "present when there are more workloads: pass it as `cursor` (with the same filters) for the next page"),
        ("deprecation" = String, description = "`@1796515200`: deprecated on 2026-12-06 (RFC 9745)"),
        ("link" = String, description = "`</api/v1/workloads>; rel=\"successor-version\"`"))),
        (status = 400, body = heddle_types::ErrorBody), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn list_jobs(
    state: State<AppState>,
    caller: Caller,
    filter: Query<WorkloadFilter>,
) -> ApiResult<Page<WorkloadSummary>> {
    list_workloads(state, caller, filter).await
}

/// The first name of `GET /api/v1/workloads/{id}`, answered the same, with the deprecation
/// headers of [`deprecated_alias`].
#[deprecated = "GET /api/v1/workloads/{id}"]
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "verdicts", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = Workload, headers(
        ("deprecation" = String, description = "`@1796515200`: deprecated on 2026-12-06 (RFC 9745)"),
        ("link" = String, description = "`</api/v1/workloads/{id}>; rel=\"successor-version\"`"))),
        (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_job(
    state: State<AppState>,
    caller: Caller,
    id: Path<Uuid>,
) -> ApiResult<Json<Workload>> {
    get_workload(state, caller, id).await
}

/// The path `/api/v1/jobs` was renamed from; `/api/v1/workloads` is its successor.
const DEPRECATED_PREFIX: &str = "/api/v1/jobs";
const SUCCESSOR_PREFIX: &str = "/api/v1/workloads";
/// When `/api/v1/jobs` was deprecated: 2026-12-06T00:00:00Z, as RFC 9745's `Deprecation`
/// header writes it (`@` and Unix seconds).
const JOBS_DEPRECATED_AT: &str = "@1796515200";

/// Layer of the deprecated `/api/v1/jobs` routes: every answer, refusals included, says when
/// the path was deprecated (`Deprecation`, RFC 9745) and which path replaces it (`Link`
/// with `rel="successor-version"`, RFC 5829); the body and status are the successor's.
pub async fn deprecated_alias(req: Request, next: Next) -> Response {
    let successor = req
        .uri()
        .path()
        .strip_prefix(DEPRECATED_PREFIX)
        .map(|rest| format!("<{SUCCESSOR_PREFIX}{rest}>; rel=\"successor-version\""));
    let mut response = next.run(req).await;
    let headers = response.headers_mut();
    headers.insert(
        HeaderName::from_static("deprecation"),
        HeaderValue::from_static(JOBS_DEPRECATED_AT),
    );
    if let Some(link) = successor.and_then(|l| HeaderValue::from_str(&l).ok()) {
        headers.insert(header::LINK, link);
    }
    response
}
