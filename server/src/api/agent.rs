//! The agent protocol after enrollment (`enroll.rs`): heartbeats, facts, job claims and
//! results (rendezvous: `rendezvous.rs`). Every statement here is safe when several replicas serve the same
//! agents.
//!
//! A job belongs to whoever claimed it last: each claim gets a fresh `claim_id`, kept after
//! the lease ends. Renewals, results and rank 0's rendezvous post are accepted only under the
//! job's latest claim; anything sent under an older one gets 409 `stale_claim`.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use heddle_types::agent::*;
use heddle_types::jobs::{Progress, ResultUpload};
use uuid::Uuid;

use crate::http::auth::AgentCaller;
use crate::http::error::{ApiError, ApiResult, Json, Path};
use crate::jobs::{self, read, results::Stored, results::Uploader};
use crate::nodes;
use crate::state::AppState;

fn lease_secs(state: &AppState) -> f64 {
    state.config.lease_ttl().as_secs_f64()
}

/// While this replica knows its database to be out of reach (its lease reaper or `/readyz`
/// found it so), the agent calls that renew leases answer 503 at once: the agent asks the
/// next replica before its lease lapses, instead of waiting on a connection that hangs (a
/// cut network) or having a heartbeat taken into memory that this replica cannot write.
fn refuse_while_unreachable(state: &AppState) -> ApiResult<()> {
    match state.db_reach.outage() {
        None => Ok(()),
        Some(o) => Err(ApiError::Unavailable(sqlx::Error::Io(
            std::io::Error::other(format!(
                "database unreachable since {}: {}",
                o.since, o.last_error
            )),
        ))),
    }
}

/// An agent's version is shown beside its node: free text, under the label rule.
pub fn check_agent_version(version: Option<&str>) -> ApiResult<()> {
    match version {
        Some(v) => {
            heddle_types::names::check_label("agent_version", v).map_err(ApiError::Unprocessable)
        }
        None => Ok(()),
    }
}

/// Heartbeat: marks the agent alive, renews the leases of its running jobs and says which
/// of them to stop. Only reads: the liveness and the renewals are written in this replica's
/// next batch (`liveness.rs`).
#[utoipa::path(post, path = "/api/v1/agent/heartbeat", tag = "agent", security(("agent" = [])), request_body = HeartbeatRequest,
    responses((status = 200, body = HeartbeatResponse), (status = 401, body = heddle_types::ErrorBody)))]
pub async fn heartbeat(
    State(state): State<AppState>,
    agent: AgentCaller,
    Json(req): Json<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    refuse_while_unreachable(&state)?;
    check_agent_version(req.agent_version.as_deref())?;
    if req.running_jobs.len() > 1024 {
        return Err(ApiError::Unprocessable(
            "running_jobs lists more than 1024 jobs".into(),
        ));
    }
    // Most heartbeats name no job, report the facts last stored and find the job
    // environment's version known: nothing to read.
    let from_memory = state
        .facts_seen
        .send_facts(agent.node_id, req.facts_sha256.as_deref());
    let env_from_memory = state.job_env_seen.get(agent.node_id);
    if let (true, Some(send_facts), Some(job_env_sha256)) =
        (req.running_jobs.is_empty(), from_memory, env_from_memory)
    {
        state
            .liveness
            .record(agent.agent_id, agent.node_id, req.agent_version, vec![]);
        return Ok(Json(HeartbeatResponse {
            heartbeat_interval_s: state.config.heartbeat_interval_s,
            send_facts,
            cancel_jobs: vec![],
            job_env_sha256: Some(job_env_sha256),
            server_time_ns: chrono::Utc::now().timestamp_nanos_opt(),
        }));
    }
    // Of the jobs named, those still leased to this agent (their leases are renewed, a
    // cancelled one's too until the agent confirms) and those it should go on running.
    let mut conn = state
        .metrics
        .pools
        .acquire("agent", &state.agent_db)
        .await?;
    let read::HeartbeatView {
        facts_sha256: stored_sha,
        job_env_sha256: env_sha,
        leased,
        keep,
    } = read::heartbeat_view(&mut conn, agent.node_id, agent.agent_id, &req.running_jobs).await?;
    drop(conn);
    if let Some(stored) = &stored_sha {
        state.facts_seen.set(agent.node_id, stored);
    }
    // Changed since last computed: the versions worker computes it, and until then the
    // answer carries none (the agent keeps its file).
    match &env_sha {
        Some(sha) => state.job_env_seen.set(agent.node_id, sha),
        None => state.job_env_seen.due.notify_one(),
    }
    let cancel_jobs: Vec<Uuid> = req
        .running_jobs
        .iter()
        .filter(|id| !keep.contains(id))
        .copied()
        .collect();
    let send_facts = match (&stored_sha, &req.facts_sha256) {
        (None, _) => true,
        (Some(stored), Some(theirs)) => stored != theirs,
        (Some(_), None) => false,
    };
    state
        .liveness
        .record(agent.agent_id, agent.node_id, req.agent_version, leased);
    Ok(Json(HeartbeatResponse {
        heartbeat_interval_s: state.config.heartbeat_interval_s,
        send_facts,
        cancel_jobs,
        job_env_sha256: env_sha,
        server_time_ns: chrono::Utc::now().timestamp_nanos_opt(),
    }))
}

/// The node's job environment, for the node env file the agent keeps (it asks when a
/// heartbeat's `job_env_sha256` differs from its file's).
#[utoipa::path(get, path = "/api/v1/agent/env", tag = "agent", security(("agent" = [])),
    responses((status = 200, body = NodeJobEnv), (status = 401, body = heddle_types::ErrorBody)))]
pub async fn job_env(
    State(state): State<AppState>,
    agent: AgentCaller,
) -> ApiResult<Json<NodeJobEnv>> {
    let env = crate::job_env::current(&state.db, agent.node_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("this agent's node is gone".into()))?;
    state.job_env_seen.set(agent.node_id, &env.job_env_sha256);
    Ok(Json(env))
}

use heddle_types::FACTS_SHA_HEADER;

/// Replace the node's latest facts; a change is kept in the facts history.
#[utoipa::path(put, path = "/api/v1/agent/facts", tag = "agent", security(("agent" = [])),
    request_body(content = Object, description = "node facts document (see schema/facts.schema.json)"),
    responses((status = 200, body = FactsAccepted), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn put_facts(
    State(state): State<AppState>,
    agent: AgentCaller,
    headers: HeaderMap,
    Json(facts): Json<serde_json::Value>,
) -> ApiResult<Json<FactsAccepted>> {
    if !facts.is_object() {
        return Err(ApiError::Unprocessable(
            "facts must be a JSON object".into(),
        ));
    }
    let sha = match headers.get(FACTS_SHA_HEADER).map(|v| v.to_str()) {
        Some(Ok(s)) if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) => {
            s.to_ascii_lowercase()
        }
        Some(_) => {
            return Err(ApiError::BadRequest(format!(
                "{FACTS_SHA_HEADER} must be 64 hex digits"
            )));
        }
        None => heddle_types::facts_sha256(&facts),
    };
    let mut tx = state.db.begin().await?;
    let changed = nodes::store_facts(
        &mut tx,
        agent.node_id,
        &facts,
        &sha,
        state.config.facts_history_keep,
    )
    .await?;
    tx.commit().await?;
    state.facts_seen.set(agent.node_id, &sha);
    if changed {
        state.plugins.wake.notify_one();
    }
    Ok(Json(FactsAccepted {
        node_id: agent.node_id,
        facts_sha256: sha,
        changed,
    }))
}

/// Claim the oldest queued job for this agent's node. `FOR UPDATE SKIP LOCKED` lets any
/// number of replicas claim concurrently without handing one job out twice.
#[utoipa::path(post, path = "/api/v1/agent/jobs/claim", tag = "agent", security(("agent" = [])),
    responses((status = 200, body = JobLease), (status = 204, description = "nothing queued")))]
pub async fn claim(State(state): State<AppState>, agent: AgentCaller) -> ApiResult<Response> {
    refuse_while_unreachable(&state)?;
    let mut conn = state
        .metrics
        .pools
        .acquire("agent", &state.agent_db)
        .await?;
    let row =
        jobs::store::claim(&mut conn, agent.node_id, agent.agent_id, lease_secs(&state)).await?;
    Ok(match row {
        None => StatusCode::NO_CONTENT.into_response(),
        Some(r) => Json(JobLease {
            job_id: r.id,
            claim_id: r.claim_id,
            run_id: r.run_id,
            spec: r.spec,
            rank: r.rank,
            world_size: r.world_size,
            attempt: r.attempts,
            lease_expires_at: r.lease_expires_at,
            lease_s: Some(lease_secs(&state)),
        })
        .into_response(),
    })
}

/// Renew a lease and report progress; the first renewal marks the job running.
#[utoipa::path(post, path = "/api/v1/agent/jobs/{id}/renew", tag = "agent", security(("agent" = [])),
    params(("id" = Uuid, Path)), request_body = LeaseRenew,
    responses((status = 200, body = LeaseRenewed), (status = 409, body = heddle_types::ErrorBody, description = "lease lost")))]
pub async fn renew(
    State(state): State<AppState>,
    agent: AgentCaller,
    Path(id): Path<Uuid>,
    Json(req): Json<LeaseRenew>,
) -> ApiResult<Json<LeaseRenewed>> {
    if let Some(Progress { message, fraction }) = &req.progress
        && (message.len() > 1024 || fraction.is_some_and(|f| !(0.0..=1.0).contains(&f)))
    {
        return Err(ApiError::Unprocessable(
            "progress message must be at most 1024 bytes and fraction within 0..1".into(),
        ));
    }
    refuse_while_unreachable(&state)?;
    let mut conn = state
        .metrics
        .pools
        .acquire("agent", &state.agent_db)
        .await?;
    let (lease_expires_at, cancel) = jobs::store::renew(
        &mut conn,
        id,
        agent.agent_id,
        req.claim_id,
        req.progress.as_ref(),
        lease_secs(&state),
    )
    .await?;
    Ok(Json(LeaseRenewed {
        lease_expires_at,
        lease_s: Some(lease_secs(&state)),
        cancel,
    }))
}

/// Upload a job's result. Idempotent on `upload_key`: a retry of a stored upload answers
/// 200 and stores nothing; a different result for a finished job answers 409.
#[utoipa::path(post, path = "/api/v1/agent/jobs/{id}/result", tag = "agent", security(("agent" = [])),
    params(("id" = Uuid, Path)), request_body = ResultUpload,
    responses((status = 201, body = UploadAccepted), (status = 200, body = UploadAccepted, description = "already stored"),
        (status = 404, body = heddle_types::ErrorBody), (status = 409, body = heddle_types::ErrorBody)))]
pub async fn upload_result(
    State(state): State<AppState>,
    agent: AgentCaller,
    Path(id): Path<Uuid>,
    Json(up): Json<ResultUpload>,
) -> ApiResult<(StatusCode, Json<UploadAccepted>)> {
    if up.upload_key.is_empty() || up.upload_key.len() > 128 {
        return Err(ApiError::Unprocessable(
            "upload_key must be 1-128 characters".into(),
        ));
    }
    if up.rows.len() > 100_000 {
        return Err(ApiError::Unprocessable(
            "a result may hold at most 100000 rows".into(),
        ));
    }
    let by = Uploader {
        agent_id: agent.agent_id,
        node_id: agent.node_id,
    };
    let tx = state.metrics.pools.begin("main", &state.db).await?;
    match jobs::results::store_result(tx, by, id, &up).await? {
        Stored::New(new) => {
            let result_id =
                crate::health::verdict::upload::judge_upload(&state.db, *new, &up).await?;
            Ok((
                StatusCode::CREATED,
                Json(UploadAccepted {
                    result_id,
                    created: true,
                }),
            ))
        }
        Stored::Again(result_id) => {
            // A retry after a failed judgement gets its verdict now.
            let judged = crate::health::store::is_judged(&state.db, result_id).await?;
            if !judged {
                judge(&state, result_id).await;
            }
            Ok((
                StatusCode::OK,
                Json(UploadAccepted {
                    result_id,
                    created: false,
                }),
            ))
        }
    }
}

/// Judges a result stored before whose judgement failed (docs/health.md): the result is
/// the agent's data and is kept whatever happens here; a failed judgement is logged and
/// made again by the next upload retry or pre-flight.
async fn judge(state: &AppState, result_id: Uuid) {
    if let Err(err) = crate::health::verdict::judge_result(&state.db, result_id).await {
        tracing::warn!(%result_id, error = %err, "judging a result failed");
        return;
    }
    // Its series' level shifts (docs/health.md, "Regressions"); a failure here leaves the
    // verdict standing and is made good by the series' next result.
    if let Err(err) = crate::health::regress::on_result(&state.db, result_id).await {
        tracing::warn!(%result_id, error = %err, "looking for regressions failed");
    }
}
