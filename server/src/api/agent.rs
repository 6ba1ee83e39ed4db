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
use chrono::{DateTime, Utc};
use heddle_types::agent::*;
use heddle_types::jobs::{JobSpec, Progress, ResultUpload};
use uuid::Uuid;

use crate::AppState;
use crate::auth::AgentCaller;
use crate::db;
use crate::error::{ApiError, ApiResult, Json, Path};

fn lease_secs(state: &AppState) -> f64 {
    state.config.lease_ttl().as_secs_f64()
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
    if req.running_jobs.len() > 1024 {
        return Err(ApiError::Unprocessable(
            "running_jobs lists more than 1024 jobs".into(),
        ));
    }
    // Of the jobs named, those still leased to this agent (their leases are renewed, a
    // cancelled one's too until the agent confirms) and those it should go on running.
    let (stored_sha, leased, keep): (Option<String>, Vec<Uuid>, Vec<Uuid>) = sqlx::query_as(
        "SELECT n.facts_sha256, coalesce(j.leased, '{}'), coalesce(j.keep, '{}')
         FROM nodes n LEFT JOIN LATERAL (
             SELECT array_agg(id) AS leased, array_agg(id) FILTER (WHERE NOT cancel_requested) AS keep
             FROM jobs WHERE id = ANY($2) AND lease_agent_id = $3 AND state IN ('leased', 'running')
         ) j ON true
         WHERE n.id = $1",
    )
    .bind(agent.node_id)
    .bind(&req.running_jobs)
    .bind(agent.agent_id)
    .fetch_one(&state.db)
    .await?;
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
    }))
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
    let cols = db::facts::extract(&facts);
    let mut tx = state.db.begin().await?;
    let changed: Option<(Uuid,)> = sqlx::query_as(
        "UPDATE nodes SET facts = $2, facts_sha256 = $3, facts_updated_at = now(), gpu_model = $4, gpu_count = $5,
                hcas = $6, port_states = $7, link_layers = $8
         WHERE id = $1 AND facts_sha256 IS DISTINCT FROM $3 RETURNING id",
    )
    .bind(agent.node_id)
    .bind(&facts)
    .bind(&sha)
    .bind(&cols.gpu_model)
    .bind(cols.gpu_count)
    .bind(&cols.hcas)
    .bind(&cols.port_states)
    .bind(&cols.link_layers)
    .fetch_optional(&mut *tx)
    .await?;
    if changed.is_some() {
        sqlx::query(
            "INSERT INTO node_facts_history (node_id, facts_sha256, facts) VALUES ($1, $2, $3)",
        )
        .bind(agent.node_id)
        .bind(&sha)
        .bind(&facts)
        .execute(&mut *tx)
        .await?;
        db::facts::prune_history(&mut tx, agent.node_id, state.config.facts_history_keep).await?;
    }
    tx.commit().await?;
    if changed.is_some() {
        state.plugins.wake.notify_one();
    }
    Ok(Json(FactsAccepted {
        node_id: agent.node_id,
        facts_sha256: sha,
        changed: changed.is_some(),
    }))
}

#[derive(sqlx::FromRow)]
struct LeaseRow {
    id: Uuid,
    claim_id: Uuid,
    run_id: Uuid,
    rank: i32,
    world_size: i32,
    attempts: i32,
    lease_expires_at: DateTime<Utc>,
    spec: sqlx::types::Json<JobSpec>,
}

/// Claim the oldest queued job for this agent's node. `FOR UPDATE SKIP LOCKED` lets any
/// number of replicas claim concurrently without handing one job out twice.
#[utoipa::path(post, path = "/api/v1/agent/jobs/claim", tag = "agent", security(("agent" = [])),
    responses((status = 200, body = JobLease), (status = 204, description = "nothing queued")))]
pub async fn claim(State(state): State<AppState>, agent: AgentCaller) -> ApiResult<Response> {
    let row: Option<LeaseRow> = sqlx::query_as(
        "WITH next AS (
             SELECT id FROM jobs WHERE node_id = $1 AND state = 'queued' AND NOT cancel_requested
             ORDER BY created_at, rank LIMIT 1 FOR UPDATE SKIP LOCKED)
         UPDATE jobs j SET state = 'leased', attempts = j.attempts + 1, lease_agent_id = $2,
                lease_expires_at = now() + make_interval(secs => $3), error = NULL,
                claim_id = $4, claim_agent_id = $2
         FROM next, runs r WHERE j.id = next.id AND r.id = j.run_id
         RETURNING j.id, j.claim_id, j.run_id, j.rank, j.world_size, j.attempts, j.lease_expires_at,
             CASE WHEN j.applied_env IS NULL THEN r.spec ELSE jsonb_set(r.spec, '{env}', COALESCE(
                 (SELECT jsonb_object_agg(e->>'name', e->>'value') FROM jsonb_array_elements(j.applied_env) e),
                 '{}'::jsonb)) END AS spec",
    )
    .bind(agent.node_id)
    .bind(agent.agent_id)
    .bind(lease_secs(&state))
    .bind(Uuid::new_v4())
    .fetch_optional(&state.db)
    .await?;
    Ok(match row {
        None => StatusCode::NO_CONTENT.into_response(),
        Some(r) => Json(JobLease {
            job_id: r.id,
            claim_id: r.claim_id,
            run_id: r.run_id,
            spec: r.spec.0,
            rank: r.rank,
            world_size: r.world_size,
            attempt: r.attempts,
            lease_expires_at: r.lease_expires_at,
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
    let row: Option<(DateTime<Utc>, bool)> = sqlx::query_as(
        "UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $3), state = 'running',
                started_at = coalesce(started_at, now()), progress = coalesce($4, progress)
         WHERE id = $1 AND lease_agent_id = $2 AND state IN ('leased', 'running')
               AND ($5::uuid IS NULL OR claim_id = $5)
         RETURNING lease_expires_at, cancel_requested",
    )
    .bind(id)
    .bind(agent.agent_id)
    .bind(lease_secs(&state))
    .bind(req.progress.map(sqlx::types::Json))
    .bind(req.claim_id)
    .fetch_optional(&state.db)
    .await?;
    match row {
        Some((lease_expires_at, cancel)) => Ok(Json(LeaseRenewed {
            lease_expires_at,
            cancel,
        })),
        None => {
            let exists: Option<(String, Option<Uuid>)> =
                sqlx::query_as("SELECT state, claim_id FROM jobs WHERE id = $1")
                    .bind(id)
                    .fetch_optional(&state.db)
                    .await?;
            match exists {
                None => Err(ApiError::NotFound(format!("no job {id}"))),
                Some((_, current)) if req.claim_id.is_some() && current != req.claim_id => {
                    Err(ApiError::StaleClaim(format!(
                        "lease on job {id} lost: it was claimed again after this claim; stop working on it"
                    )))
                }
                Some((st, _)) => Err(ApiError::Conflict(format!(
                    "lease on job {id} lost: it is {st} and not leased to this agent"
                ))),
            }
        }
    }
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
    let mut tx = state.db.begin().await?;
    // The job row lock serialises concurrent uploads for one job (retries racing on two
    // replicas included).
    let job: Option<(Uuid, String, Option<Uuid>, Option<Uuid>)> = sqlx::query_as(
        "SELECT node_id, state, claim_id, claim_agent_id FROM jobs WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let (node_id, job_state, claim_id, claim_agent) =
        job.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    if node_id != agent.node_id {
        return Err(ApiError::Forbidden(format!(
            "job {id} belongs to another node"
        )));
    }
    let by_key: Option<(Uuid, Uuid, Option<Uuid>)> =
        sqlx::query_as("SELECT id, job_id, agent_id FROM results WHERE upload_key = $1")
            .bind(&up.upload_key)
            .fetch_optional(&mut *tx)
            .await?;
    match by_key {
        // A retry of a stored upload: answered whatever became of the claim since.
        Some((result_id, job_id, by)) if job_id == id && by == Some(agent.agent_id) => {
            drop(tx);
            // A retry after a failed judgement gets its verdict now.
            let judged: Option<(Uuid,)> =
                sqlx::query_as("SELECT result_id FROM verdicts WHERE result_id = $1")
                    .bind(result_id)
                    .fetch_optional(&state.db)
                    .await?;
            if judged.is_none() {
                judge(&state, result_id).await;
            }
            return Ok((
                StatusCode::OK,
                Json(UploadAccepted {
                    result_id,
                    created: false,
                }),
            ));
        }
        Some(_) => {
            return Err(ApiError::Conflict(format!(
                "upload key {:?} was used for another job or by another agent",
                up.upload_key
            )));
        }
        None => {}
    }
    check_claim(id, claim_id, claim_agent, &agent, up.claim_id)?;
    let by_job: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM results WHERE job_id = $1")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    if by_job.is_some() {
        return Err(ApiError::Conflict(format!(
            "job {id} already has a result from another upload"
        )));
    }
    let result_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO results (id, job_id, upload_key, agent_id, outcome, reason, exit_code, stderr_tail, summary, started_at, finished_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(result_id)
    .bind(id)
    .bind(&up.upload_key)
    .bind(agent.agent_id)
    .bind(up.outcome.job_state().as_str())
    .bind(&up.reason)
    .bind(up.exit_code)
    .bind(up.stderr_tail.as_deref().map(|s| tail(s, 64 * 1024)))
    .bind(if up.summary.is_null() { serde_json::json!({}) } else { up.summary.clone() })
    .bind(up.started_at)
    .bind(up.finished_at)
    .execute(&mut *tx)
    .await?;
    insert_rows(&mut tx, result_id, &up).await?;
    // A job cancelled meanwhile stays cancelled; otherwise the outcome is its final state.
    let final_state = if job_state == "cancelled" {
        "cancelled"
    } else {
        up.outcome.job_state().as_str()
    };
    sqlx::query(
        "UPDATE jobs SET state = $2, finished_at = now(), lease_agent_id = NULL, lease_expires_at = NULL,
                started_at = coalesce(started_at, $3), error = CASE WHEN $2 IN ('failed', 'skipped') THEN $4 ELSE error END
         WHERE id = $1",
    )
    .bind(id)
    .bind(final_state)
    .bind(up.started_at)
    .bind(&up.reason)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    judge(&state, result_id).await;
    Ok((
        StatusCode::CREATED,
        Json(UploadAccepted {
            result_id,
            created: true,
        }),
    ))
}

/// A new result is stored only from the agent that made the job's latest claim, and under
/// that claim when the upload names one. (An upload that names none comes from an agent
/// older than claim ids; its agent must still be the latest claimant.)
fn check_claim(
    job: Uuid,
    current: Option<Uuid>,
    claimant: Option<Uuid>,
    agent: &AgentCaller,
    sent: Option<Uuid>,
) -> ApiResult<()> {
    if current.is_none() {
        return Err(ApiError::StaleClaim(format!(
            "job {job} was never claimed; a result needs the claim it ran under"
        )));
    }
    if claimant != Some(agent.agent_id) || sent.is_some_and(|c| Some(c) != current) {
        return Err(ApiError::StaleClaim(format!(
            "job {job} was claimed again after the claim this result ran under; the job's \
             current claim decides its result, so this one is not stored"
        )));
    }
    Ok(())
}

/// Judges a stored result (docs/health.md). After the result's transaction: the result is
/// the agent's data and is kept whatever happens here; a failed judgement is logged and
/// made again by the next upload retry or pre-flight.
async fn judge(state: &AppState, result_id: Uuid) {
    if let Err(err) = crate::health::verdict::judge_result(&state.db, result_id).await {
        tracing::warn!(%result_id, error = %err, "judging a result failed");
    }
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

async fn insert_rows(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    result_id: Uuid,
    up: &ResultUpload,
) -> Result<(), sqlx::Error> {
    // Postgres caps a statement at 65535 bind parameters; 14 per row.
    for (chunk_no, chunk) in up.rows.chunks(4000).enumerate() {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO result_rows (result_id, seq, size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs, busbw_gbs, wrong, labels, extra) ",
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
                });
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
