//! The agent protocol: enrollment, heartbeats, facts, job leases, results, rendezvous.
//! Every statement here is safe when several replicas serve the same agents.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use chrono::{DateTime, Utc};
use heddle_types::agent::*;
use heddle_types::jobs::{JobSpec, Progress, ResultUpload};
use serde::Deserialize;
use uuid::Uuid;

use crate::AppState;
use crate::auth::{self, AgentCaller};
use crate::db;
use crate::error::{ApiError, ApiResult, Json, Path, Query};

fn lease_secs(state: &AppState) -> f64 {
    state.config.lease_ttl().as_secs_f64()
}

/// Exchange an enrollment token for the agent's own credential.
#[utoipa::path(post, path = "/api/v1/agent/enroll", tag = "agent", request_body = EnrollRequest,
    responses((status = 201, body = EnrollResponse), (status = 401, body = heddle_types::ErrorBody)))]
pub async fn enroll(
    State(state): State<AppState>,
    Json(req): Json<EnrollRequest>,
) -> ApiResult<(StatusCode, Json<EnrollResponse>)> {
    let hostname = req.hostname.trim();
    let host_ok = !hostname.is_empty()
        && hostname.len() <= 253
        && hostname
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if !host_ok {
        return Err(ApiError::Unprocessable(format!(
            "hostname {hostname:?} is not a valid host name"
        )));
    }
    let mut tx = state.db.begin().await?;
    let token: Option<(Uuid,)> = sqlx::query_as(
        "UPDATE enrollment_tokens SET uses = uses + 1
         WHERE token_sha256 = $1 AND revoked_at IS NULL AND expires_at > now() AND uses < max_uses
         RETURNING id",
    )
    .bind(auth::sha256_hex(&req.enroll_token))
    .fetch_optional(&mut *tx)
    .await?;
    let (token_id,) = token.ok_or_else(|| {
        ApiError::Unauthorized("enrollment token is unknown, revoked, expired or used up".into())
    })?;
    let (node_id,): (Uuid,) = sqlx::query_as(
        "INSERT INTO nodes (id, hostname) VALUES ($1, $2)
         ON CONFLICT (hostname) DO UPDATE SET hostname = EXCLUDED.hostname RETURNING id",
    )
    .bind(Uuid::new_v4())
    .bind(hostname)
    .fetch_one(&mut *tx)
    .await?;
    // One live agent per node: a re-enrolled node (state dir lost, host rebuilt) replaces
    // the old agent, whose leases end now.
    let replaced: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE agents SET revoked_at = now() WHERE node_id = $1 AND revoked_at IS NULL RETURNING id",
    )
    .bind(node_id)
    .fetch_all(&mut *tx)
    .await?;
    if !replaced.is_empty() {
        let ids: Vec<Uuid> = replaced.iter().map(|r| r.0).collect();
        sqlx::query("UPDATE jobs SET lease_expires_at = now() WHERE lease_agent_id = ANY($1) AND state IN ('leased', 'running')")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
    }
    let credential = auth::new_secret(auth::AGENT_CREDENTIAL_PREFIX);
    let agent_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO agents (id, node_id, credential_sha256, enrollment_token_id, version, last_heartbeat_at)
         VALUES ($1, $2, $3, $4, $5, now())",
    )
    .bind(agent_id)
    .bind(node_id)
    .bind(auth::sha256_hex(&credential))
    .bind(token_id)
    .bind(&req.agent_version)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE nodes SET last_seen_at = now() WHERE id = $1")
        .bind(node_id)
        .execute(&mut *tx)
        .await?;
    db::audit(
        &mut *tx,
        &format!("agent:{agent_id}"),
        "agent.enroll",
        &format!("node:{hostname}"),
        serde_json::json!({"replaced": replaced.len(), "version": req.agent_version}),
    )
    .await?;
    tx.commit().await?;
    tracing::info!(%agent_id, %node_id, hostname, "agent enrolled");
    Ok((
        StatusCode::CREATED,
        Json(EnrollResponse {
            agent_id,
            node_id,
            credential,
            heartbeat_interval_s: state.config.heartbeat_interval_s,
        }),
    ))
}

/// Heartbeat: marks the agent alive, renews the leases of its running jobs and says which
/// of them to stop.
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
    let (stored_sha,): (Option<String>,) = sqlx::query_as(
        "WITH a AS (UPDATE agents SET last_heartbeat_at = now(), version = coalesce($2, version) WHERE id = $1 RETURNING node_id)
         UPDATE nodes SET last_seen_at = now() WHERE id = (SELECT node_id FROM a) RETURNING facts_sha256",
    )
    .bind(agent.agent_id)
    .bind(&req.agent_version)
    .fetch_one(&state.db)
    .await?;
    let mut cancel_jobs = Vec::new();
    if !req.running_jobs.is_empty() {
        let renewed: Vec<(Uuid, bool)> = sqlx::query_as(
            "UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $3)
             WHERE id = ANY($1) AND lease_agent_id = $2 AND state IN ('leased', 'running')
             RETURNING id, cancel_requested",
        )
        .bind(&req.running_jobs)
        .bind(agent.agent_id)
        .bind(lease_secs(&state))
        .fetch_all(&state.db)
        .await?;
        for id in &req.running_jobs {
            match renewed.iter().find(|(r, _)| r == id) {
                Some((_, false)) => {}
                // Cancelled, or no longer this agent's (requeued, finished, unknown).
                _ => cancel_jobs.push(*id),
            }
        }
    }
    let send_facts = match (&stored_sha, &req.facts_sha256) {
        (None, _) => true,
        (Some(stored), Some(theirs)) => stored != theirs,
        (Some(_), None) => false,
    };
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
                lease_expires_at = now() + make_interval(secs => $3), error = NULL
         FROM next, runs r WHERE j.id = next.id AND r.id = j.run_id
         RETURNING j.id, j.run_id, j.rank, j.world_size, j.attempts, j.lease_expires_at,
             CASE WHEN j.applied_env IS NULL THEN r.spec ELSE jsonb_set(r.spec, '{env}', COALESCE(
                 (SELECT jsonb_object_agg(e->>'name', e->>'value') FROM jsonb_array_elements(j.applied_env) e),
                 '{}'::jsonb)) END AS spec",
    )
    .bind(agent.node_id)
    .bind(agent.agent_id)
    .bind(lease_secs(&state))
    .fetch_optional(&state.db)
    .await?;
    Ok(match row {
        None => StatusCode::NO_CONTENT.into_response(),
        Some(r) => Json(JobLease {
            job_id: r.id,
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
         RETURNING lease_expires_at, cancel_requested",
    )
    .bind(id)
    .bind(agent.agent_id)
    .bind(lease_secs(&state))
    .bind(req.progress.map(sqlx::types::Json))
    .fetch_optional(&state.db)
    .await?;
    match row {
        Some((lease_expires_at, cancel)) => Ok(Json(LeaseRenewed {
            lease_expires_at,
            cancel,
        })),
        None => {
            let exists: Option<(String,)> = sqlx::query_as("SELECT state FROM jobs WHERE id = $1")
                .bind(id)
                .fetch_optional(&state.db)
                .await?;
            match exists {
                None => Err(ApiError::NotFound(format!("no job {id}"))),
                Some((st,)) => Err(ApiError::Conflict(format!(
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
    let job: Option<(Uuid, String)> =
        sqlx::query_as("SELECT node_id, state FROM jobs WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let (node_id, job_state) = job.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    if node_id != agent.node_id {
        return Err(ApiError::Forbidden(format!(
            "job {id} belongs to another node"
        )));
    }
    let by_key: Option<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, job_id FROM results WHERE upload_key = $1")
            .bind(&up.upload_key)
            .fetch_optional(&mut *tx)
            .await?;
    match by_key {
        Some((result_id, job_id)) if job_id == id => {
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
                "upload key {:?} was used for another job",
                up.upload_key
            )));
        }
        None => {}
    }
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

/// Agents may only meet in runs they take part in.
async fn check_member(state: &AppState, agent: &AgentCaller, run: Uuid) -> ApiResult<()> {
    let member: (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM jobs WHERE run_id = $1 AND node_id = $2)")
            .bind(run)
            .bind(agent.node_id)
            .fetch_one(&state.db)
            .await?;
    if member.0 {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "this node has no job in run {run}"
        )))
    }
}

fn check_rdv_name(name: &str) -> ApiResult<()> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(ApiError::BadRequest(
            "rendezvous name must be 1-128 letters, digits, '-', '_' or '.'".into(),
        ));
    }
    Ok(())
}

/// Rank 0 posts an opaque blob (e.g. an NCCL unique id) for the other ranks.
#[utoipa::path(put, path = "/api/v1/agent/rendezvous/{run_id}/{name}", tag = "agent", security(("agent" = [])),
    params(("run_id" = Uuid, Path), ("name" = String, Path)), request_body = RendezvousBlob,
    responses((status = 204), (status = 409, body = heddle_types::ErrorBody, description = "a different blob is already posted")))]
pub async fn rendezvous_put(
    State(state): State<AppState>,
    agent: AgentCaller,
    Path((run, name)): Path<(Uuid, String)>,
    Json(req): Json<RendezvousBlob>,
) -> ApiResult<StatusCode> {
    check_rdv_name(&name)?;
    check_member(&state, &agent, run).await?;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(&req.blob_b64)
        .map_err(|e| ApiError::BadRequest(format!("blob_b64 is not base64: {e}")))?;
    if blob.len() > 64 * 1024 {
        return Err(ApiError::PayloadTooLarge(
            "rendezvous blobs are at most 64 KiB".into(),
        ));
    }
    let inserted = sqlx::query(
        "INSERT INTO rendezvous (run_id, name, blob) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(run)
    .bind(&name)
    .bind(&blob)
    .execute(&state.db)
    .await?;
    if inserted.rows_affected() == 0 {
        let (stored,): (Vec<u8>,) =
            sqlx::query_as("SELECT blob FROM rendezvous WHERE run_id = $1 AND name = $2")
                .bind(run)
                .bind(&name)
                .fetch_one(&state.db)
                .await?;
        if stored != blob {
            return Err(ApiError::Conflict(format!(
                "rendezvous {name:?} of run {run} already holds another blob"
            )));
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// How long to wait for rank 0 (default 30000, at most 120000).
    timeout_ms: Option<u64>,
}

/// Wait for rank 0's blob; answers 408 `rendezvous_timeout` when it does not come in time.
#[utoipa::path(get, path = "/api/v1/agent/rendezvous/{run_id}/{name}", tag = "agent", security(("agent" = [])),
    params(("run_id" = Uuid, Path), ("name" = String, Path), WaitQuery),
    responses((status = 200, body = RendezvousBlob), (status = 408, body = heddle_types::ErrorBody)))]
pub async fn rendezvous_get(
    State(state): State<AppState>,
    agent: AgentCaller,
    Path((run, name)): Path<(Uuid, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Json<RendezvousBlob>> {
    check_rdv_name(&name)?;
    check_member(&state, &agent, run).await?;
    let deadline = tokio::time::Instant::now()
        + Duration::from_millis(q.timeout_ms.unwrap_or(30_000).min(120_000));
    // Polling keeps replicas independent: whichever one rank 0 posted to, Postgres has it.
    loop {
        let row: Option<(Vec<u8>,)> =
            sqlx::query_as("SELECT blob FROM rendezvous WHERE run_id = $1 AND name = $2")
                .bind(run)
                .bind(&name)
                .fetch_optional(&state.db)
                .await?;
        if let Some((blob,)) = row {
            return Ok(Json(RendezvousBlob {
                blob_b64: base64::engine::general_purpose::STANDARD.encode(blob),
            }));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::Timeout(
                "rendezvous_timeout",
                format!("nothing posted to rendezvous {name:?} of run {run} in time"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
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
