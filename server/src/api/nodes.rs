//! Nodes, their facts history, sites, recommendations, tuning profiles and the env export.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use heddle_types::auth::Role;
use heddle_types::env_policy;
use heddle_types::nodes::*;
use serde::Deserialize;
use uuid::Uuid;

use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path, Query, duplicate_name};
use crate::nodes::{self, NewProfile};
use crate::state::AppState;
use crate::{job_env, recommendations};

/// One node (by id or hostname) with its latest facts and recommendations.
#[utoipa::path(get, path = "/api/v1/nodes/{node}", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path, description = "node id or hostname")),
    responses((status = 200, body = NodeDetail), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_node(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<NodeDetail>> {
    caller.require(Role::Viewer)?;
    let id = db::resolve_node(&state.db, &key).await?;
    let row = nodes::node(&state.db, id).await?;
    let (facts, facts_sha256) = nodes::facts(&state.db, id).await?;
    Ok(Json(NodeDetail {
        summary: row.summary(state.config.heartbeat_interval()),
        facts,
        facts_sha256,
        recommendations: recommendations::effective_env(&state.db, id).await?,
        checks: crate::health::checks::for_node(&state.db, id).await?,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    limit: Option<i64>,
}

/// Past facts of a node, newest first: one entry per change.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/facts/history", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path), HistoryQuery), responses((status = 200, body = [FactsSnapshot])))]
pub async fn facts_history(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> ApiResult<Json<Vec<FactsSnapshot>>> {
    caller.require(Role::Viewer)?;
    let id = db::resolve_node(&state.db, &key).await?;
    let limit = super::limit(q.limit, 20);
    Ok(Json(nodes::facts_history(&state.db, id, limit).await?))
}

/// Attach a node to a site (or detach it).
#[utoipa::path(patch, path = "/api/v1/nodes/{node}", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path)), request_body = NodeUpdate,
    responses((status = 204), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn update_node(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Json(req): Json<NodeUpdate>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Operator)?;
    let mut tx = state.db.begin().await?;
    let id = db::resolve_node(&mut *tx, &key).await?;
    let site_id = match &req.site {
        Some(name) => Some(db::resolve_site(&mut *tx, name).await?),
        None => None,
    };
    nodes::set_site(&mut tx, id, site_id).await?;
    job_env::mark_changed(&mut tx, job_env::Changed::Nodes(&[id])).await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "node.update",
        &format!("node:{id}"),
        serde_json::json!({"site": req.site}),
    )
    .await?;
    tx.commit().await?;
    state.job_env_seen.forget(&[id]);
    Ok(StatusCode::NO_CONTENT)
}

/// Every variable of the node's environment: its value, the plugin or profile it came from,
/// the reason, and each value it overrode with that value's source.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/env/explain", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path, description = "node id or hostname")),
    responses((status = 200, body = [heddle_types::recommend::ExplainedVar]), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn node_env_explain(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<Vec<heddle_types::recommend::ExplainedVar>>> {
    caller.require(Role::Viewer)?;
    let id = db::resolve_node(&state.db, &key).await?;
    let mut conn = state.db.acquire().await?;
    Ok(Json(recommendations::explain(&mut conn, id).await?))
}

/// `export NAME=VALUE` lines for a job script to `source`.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/env", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path)),
    responses((status = 200, content_type = "text/plain", body = String), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn node_env(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<impl IntoResponse> {
    caller.require(Role::Viewer)?;
    let id = db::resolve_node(&state.db, &key).await?;
    let recs = recommendations::effective_env(&state.db, id).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        recommendations::render_export(&key, &recs)?,
    ))
}

/// The node's job environment: what Heddle's NCCL environment plugin gives every NCCL job on
/// the node, as its agent writes it to the node env file (`heddle env NODE --format
/// nccl-conf` renders it).
#[utoipa::path(get, path = "/api/v1/nodes/{node}/job-env", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path, description = "node id or hostname")),
    responses((status = 200, body = heddle_types::agent::NodeJobEnv), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn node_job_env(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<heddle_types::agent::NodeJobEnv>> {
    caller.require(Role::Viewer)?;
    let id = db::resolve_node(&state.db, &key).await?;
    let env = job_env::current(&state.db, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no node {key}")))?;
    state.job_env_seen.set(id, &env.job_env_sha256);
    Ok(Json(env))
}

/// Replace one source's recommendations and traits on a node (plugins write through this).
#[utoipa::path(put, path = "/api/v1/nodes/{node}/recommendations", tag = "nodes", security(("bearer" = [])),
    params(("node" = String, Path)), request_body = RecommendationSet,
    responses((status = 204), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn put_recommendations(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
    Json(req): Json<RecommendationSet>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Operator)?;
    if req.source.is_empty() || req.source.len() > 200 {
        return Err(ApiError::Unprocessable(
            "source must be 1-200 characters".into(),
        ));
    }
    env_policy::check_text("source", "these recommendations", &req.source)?;
    if req.source.starts_with("plugin:") {
        return Err(ApiError::Unprocessable(
            "sources named plugin:… belong to enabled plugins; enable the plugin instead".into(),
        ));
    }
    for item in &req.items {
        env_policy::check_var(&item.name, &item.value)?;
        env_policy::check_text("reason", &item.name, &item.reason)?;
    }
    for (key, value) in &req.traits {
        heddle_types::names::check_label("a trait's key", key).map_err(ApiError::Unprocessable)?;
        heddle_types::names::check_label("a trait's value", value)
            .map_err(ApiError::Unprocessable)?;
    }
    let mut tx = state.db.begin().await?;
    let id = db::resolve_node(&mut *tx, &key).await?;
    recommendations::replace_source(&mut tx, id, &req).await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "node.recommendations",
        &format!("node:{id}"),
        serde_json::json!({"source": req.source, "count": req.items.len()}),
    )
    .await?;
    tx.commit().await?;
    state.job_env_seen.forget(&[id]);
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/sites", tag = "nodes", security(("bearer" = [])), request_body = SiteCreate,
    responses((status = 201, body = Site), (status = 409, body = heddle_types::ErrorBody)))]
pub async fn create_site(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<SiteCreate>,
) -> ApiResult<(StatusCode, Json<Site>)> {
    caller.require(Role::Operator)?;
    db::check_name("site name", &req.name)?;
    let mut tx = state.db.begin().await?;
    let site = nodes::insert_site(&mut tx, &req.name, &req.traits)
        .await
        .map_err(duplicate_name("site", &req.name))?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "site.create",
        &format!("site:{}", req.name),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(site)))
}

#[utoipa::path(get, path = "/api/v1/sites", tag = "nodes", security(("bearer" = [])), responses((status = 200, body = [Site])))]
pub async fn list_sites(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<Site>>> {
    caller.require(Role::Viewer)?;
    Ok(Json(nodes::sites(&state.db).await?))
}

/// Whose job environment a tuning profile is part of.
fn profile_scope(node_id: &Option<Uuid>, site_id: Option<Uuid>) -> job_env::Changed<'_> {
    match (site_id, node_id) {
        (Some(site), _) => job_env::Changed::Site(site),
        (None, node) => job_env::Changed::Nodes(node.as_slice()),
    }
}

/// Stores a tuning profile and its audit entry (`detail`) in the caller's transaction; a
/// taken name is a conflict. Profiles created directly and sweep winners kept as profiles
/// both go through here. Returns the profile and the nodes whose job environment it
/// changes (to forget in `AppState::job_env_seen` once committed).
pub(crate) async fn insert_profile(
    tx: &mut sqlx::PgConnection,
    caller: &Caller,
    p: NewProfile<'_>,
    detail: serde_json::Value,
) -> ApiResult<(TuningProfile, Vec<Uuid>)> {
    let row = nodes::insert_profile(tx, &p, &caller.actor())
        .await
        .map_err(duplicate_name("tuning profile", p.name))?;
    let changed = job_env::mark_changed(&mut *tx, profile_scope(&row.node_id, row.site_id)).await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "tuning_profile.create",
        &format!("tuning_profile:{}", p.name),
        detail,
    )
    .await?;
    Ok((row, changed))
}

/// Keep a set of env values (e.g. a sweep's winner) for a node or a site; it feeds the
/// env export.
#[utoipa::path(post, path = "/api/v1/tuning-profiles", tag = "nodes", security(("bearer" = [])),
    request_body = TuningProfileCreate, responses((status = 201, body = TuningProfile), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn create_profile(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<TuningProfileCreate>,
) -> ApiResult<(StatusCode, Json<TuningProfile>)> {
    caller.require(Role::Operator)?;
    db::check_name("profile name", &req.name)?;
    if req.node.is_some() == req.site.is_some() {
        return Err(ApiError::Unprocessable(
            "give exactly one of node or site".into(),
        ));
    }
    if req.env.is_empty() {
        return Err(ApiError::Unprocessable(
            "env must set at least one variable".into(),
        ));
    }
    db::check_env(&req.env, "the tuning profile")?;
    let mut tx = state.db.begin().await?;
    let node_id = match &req.node {
        Some(n) => Some(db::resolve_node(&mut *tx, n).await?),
        None => None,
    };
    let site_id = match &req.site {
        Some(s) => Some(db::resolve_site(&mut *tx, s).await?),
        None => None,
    };
    let profile = NewProfile {
        name: &req.name,
        node_id,
        site_id,
        env: &req.env,
        source_run_id: req.source_run_id,
    };
    let (row, changed) = insert_profile(
        &mut tx,
        &caller,
        profile,
        serde_json::json!({"env": req.env}),
    )
    .await?;
    tx.commit().await?;
    state.job_env_seen.forget(&changed);
    Ok((StatusCode::CREATED, Json(row)))
}

#[utoipa::path(get, path = "/api/v1/tuning-profiles", tag = "nodes", security(("bearer" = [])),
    responses((status = 200, body = [TuningProfile])))]
pub async fn list_profiles(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<TuningProfile>>> {
    caller.require(Role::Viewer)?;
    Ok(Json(nodes::profiles(&state.db).await?))
}

#[utoipa::path(delete, path = "/api/v1/tuning-profiles/{id}", tag = "nodes", security(("bearer" = [])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn delete_profile(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Operator)?;
    let mut tx = state.db.begin().await?;
    let gone = nodes::delete_profile(&mut tx, id).await?;
    let row = gone.ok_or_else(|| ApiError::NotFound(format!("no tuning profile {id}")))?;
    let changed = job_env::mark_changed(&mut tx, profile_scope(&row.node_id, row.site_id)).await?;
    let name = row.name.clone();
    db::audit(
        &mut *tx,
        &caller.actor(),
        "tuning_profile.delete",
        &format!("tuning_profile:{name}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    state.job_env_seen.forget(&changed);
    Ok(StatusCode::NO_CONTENT)
}
