//! Runs (what a person starts) and their jobs (what each agent executes) and results.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use heddle_types::auth::Role;
use heddle_types::jobs::*;
use serde::Deserialize;
use uuid::Uuid;

use crate::api::page::{self, Page};
use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::jobs::{self, MAX_RUN_NODES, NewRun, load_run, read, validate_spec};
use crate::state::AppState;

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
    // People's labels are checked here; the server's own (an investigation's pair, named by
    // two host names of up to 253 bytes each) go to `insert_run` as they are.
    if let Some(label) = &req.label {
        heddle_types::names::check_label("the run's label", label)
            .map_err(ApiError::Unprocessable)?;
    }
    let max_attempts = req.max_attempts.unwrap_or(3);
    if !(1..=100).contains(&max_attempts) {
        return Err(ApiError::Unprocessable(
            "max_attempts must be between 1 and 100".into(),
        ));
    }
    let mut tx = state.db.begin().await?;
    let node_ids = jobs::resolve_run_nodes(&mut tx, &req.nodes).await?;
    let recommended_env = req.recommended_env.unwrap_or(true);
    let run_id = jobs::insert_run(
        &mut tx,
        &NewRun {
            spec: &spec,
            nodes: &node_ids,
            max_attempts,
            label: req.label.as_deref(),
            actor: &caller.actor(),
            recommended_env,
            audit: serde_json::json!({"nodes": req.nodes, "recommended_env": recommended_env}),
        },
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
    /// Runs per page (default 50, at most 1000).
    limit: Option<i64>,
    /// Where the next page starts: the `x-next-cursor` of the previous page.
    cursor: Option<String>,
}

/// A run's place in the newest-first order, as a cursor holds it: `created_at|id`.
fn run_key(created_at: DateTime<Utc>, id: Uuid) -> String {
    format!(
        "{}|{id}",
        created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    )
}

fn parse_run_key(key: &str) -> ApiResult<(DateTime<Utc>, Uuid)> {
    let refuse = || ApiError::BadRequest("cursor is not one this server handed out".into());
    let (at, id) = key.split_once('|').ok_or_else(refuse)?;
    let at = DateTime::parse_from_rfc3339(at).map_err(|_| refuse())?;
    Ok((at.with_timezone(&Utc), id.parse().map_err(|_| refuse())?))
}

/// Recent runs, newest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/runs", tag = "runs", security(("bearer" = [])), params(RunFilter),
    responses((status = 200, body = [Run], headers(("x-next-cursor" = String,
        description = "present when there are older runs: pass it as `cursor` (with the same filters) for the next page"))),
        (status = 400, body = heddle_types::ErrorBody)))]
pub async fn list_runs(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<RunFilter>,
) -> ApiResult<Page<Run>> {
    caller.require(Role::Viewer)?;
    let (after_at, after_id) = match f.cursor.as_deref().map(page::decode).transpose()? {
        Some(key) => {
            let (at, id) = parse_run_key(&key)?;
            (Some(at), Some(id))
        }
        None => (None, None),
    };
    let limit = super::limit(f.limit, 50);
    let node = match &f.node {
        Some(key) => Some(db::resolve_node(&state.db, key).await?),
        None => None,
    };
    let filter = read::RunFilter {
        node,
        kind: f.kind.as_deref(),
        before: after_at.zip(after_id),
    };
    let ids = read::run_ids(&state.db, &filter, limit + 1).await?;
    let ids = Page::of(ids, limit, |(id, at)| run_key(*at, *id));
    let mut runs = Vec::with_capacity(ids.rows.len());
    for (id, _) in &ids.rows {
        runs.push(load_run(&state.db, *id).await?);
    }
    Ok(Page {
        rows: runs,
        next: ids.next,
    })
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
    jobs::runs::cancel_run(&state.db, id, &caller.actor()).await?;
    Ok(Json(load_run(&state.db, id).await?))
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ResultsPage {
    /// Results per page, in rank order (default and most 1000).
    limit: Option<i64>,
    /// Where the next page starts: the `x-next-cursor` of the previous page.
    cursor: Option<String>,
}

/// Results of a run's jobs with their measured rows, by rank, a page at a time.
#[utoipa::path(get, path = "/api/v1/runs/{id}/results", tag = "runs", security(("bearer" = [])), params(("id" = Uuid, Path), ResultsPage),
    responses((status = 200, body = [JobResult], headers(("x-next-cursor" = String,
        description = "present when there are more results: pass it as `cursor` for the next page"))),
        (status = 400, body = heddle_types::ErrorBody), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn run_results(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
    Query(q): Query<ResultsPage>,
) -> ApiResult<Page<JobResult>> {
    caller.require(Role::Viewer)?;
    let after_rank: Option<i32> = match q.cursor.as_deref().map(page::decode).transpose()? {
        Some(key) => Some(key.parse().map_err(|_| {
            ApiError::BadRequest("cursor is not one this server handed out".into())
        })?),
        None => None,
    };
    let limit = super::limit(q.limit, 1000);
    if !read::run_exists(&state.db, id).await? {
        return Err(ApiError::NotFound(format!("no run {id}")));
    }
    let results = read::results(&state.db, id, after_rank, limit + 1).await?;
    let Page { rows, next } = Page::of(results, limit, |(rank, _)| rank.to_string());
    let ids: Vec<Uuid> = rows.iter().map(|(_, r)| r.id).collect();
    let mut verdicts = crate::health::store::for_results(&state.db, &ids).await?;
    let out = rows
        .into_iter()
        .map(|(_, mut r)| {
            r.verdict = verdicts.remove(&r.id);
            r
        })
        .collect();
    Ok(Page { rows: out, next })
}
