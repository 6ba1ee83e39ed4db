//! Expectations: what a test's figure should reach. Operators add and delete their own;
//! the built-in table and plugins' expectations are listed beside them.

use axum::extract::State;
use axum::http::StatusCode;
use heddle_types::auth::Role;
use heddle_types::health::{Expectation, ExpectationCreate};
use serde::Deserialize;
use uuid::Uuid;

use crate::db;
use crate::health::expectations::{self as table, operators};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::state::AppState;

const METRICS: [&str; 5] = [
    "busbw_gbs",
    "algbw_gbs",
    "time_us",
    heddle_types::kinds::rdma_ab::SPEEDUP_METRIC,
    heddle_types::regress::MIN_CHANGE_METRIC,
];

fn check(req: &ExpectationCreate) -> ApiResult<()> {
    let rule = heddle_types::names::TEST;
    if !rule.allows(&req.test) {
        return Err(ApiError::Unprocessable(format!(
            "test {:?} must be {} (e.g. nccl.all_reduce)",
            req.test,
            rule.describe()
        )));
    }
    if !METRICS.contains(&req.metric.as_str()) {
        return Err(ApiError::Unprocessable(format!(
            "metric must be one of {}",
            METRICS.join(", ")
        )));
    }
    if !(req.value.is_finite() && req.value > 0.0 && req.value < 1e12) {
        return Err(ApiError::Unprocessable(
            "value must be a positive number below 1e12".into(),
        ));
    }
    if req.metric == heddle_types::regress::MIN_CHANGE_METRIC && req.value >= 1.0 {
        return Err(ApiError::Unprocessable(format!(
            "{} is a fraction of the level before (0.05: 5 %), below 1",
            heddle_types::regress::MIN_CHANGE_METRIC
        )));
    }
    let text_ok = |s: &str, max: usize| !s.trim().is_empty() && s.len() <= max && !s.contains('\0');
    if !text_ok(&req.source, 512) {
        return Err(ApiError::Unprocessable(
            "source must say where the figure comes from (1-512 bytes)".into(),
        ));
    }
    if req.gpu_model.as_deref().is_some_and(|m| !text_ok(m, 128)) {
        return Err(ApiError::Unprocessable(
            "gpu_model must be 1-128 bytes".into(),
        ));
    }
    if req.min_size_bytes.is_some_and(|n| n < 0) {
        return Err(ApiError::Unprocessable(
            "min_size_bytes must not be negative".into(),
        ));
    }
    if req.gpu_count.is_some_and(|n| !(1..=1_000_000).contains(&n))
        || req.world_size.is_some_and(|n| !(1..=4096).contains(&n))
    {
        return Err(ApiError::Unprocessable(
            "gpu_count must be 1-1000000 and world_size 1-4096".into(),
        ));
    }
    Ok(())
}

/// Add an expectation. It takes precedence over plugins' and built-in ones for the
/// figures it matches, from the next judged result on.
#[utoipa::path(post, path = "/api/v1/expectations", tag = "verdicts", security(("bearer" = [])), request_body = ExpectationCreate,
    responses((status = 201, body = Expectation), (status = 404, body = heddle_types::ErrorBody), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<ExpectationCreate>,
) -> ApiResult<(StatusCode, Json<Expectation>)> {
    caller.require(Role::Operator)?;
    check(&req)?;
    let mut tx = state.db.begin().await?;
    let node_id = match &req.node {
        Some(key) => Some(db::resolve_node(&mut *tx, key).await?),
        None => None,
    };
    let id = Uuid::new_v4();
    let made = operators::insert(&mut tx, id, &req, node_id, &caller.actor()).await?;
    db::audit(&mut *tx, &caller.actor(), "expectation.create", &format!("expectation:{id}"),
        serde_json::json!({"test": req.test, "metric": req.metric, "value": req.value, "node": req.node})).await?;
    tx.commit().await?;
    tracing::info!(%id, test = %req.test, "expectation added");
    Ok((StatusCode::CREATED, Json(made)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ExpectationFilter {
    /// Only this test (`nccl.all_reduce`).
    test: Option<String>,
    /// `builtin`, `plugin` or `operator`.
    origin: Option<String>,
    /// Include the expectations this node's enabled plugins return (id or hostname).
    node: Option<String>,
}

/// Operator expectations, the built-in table, and with `node` that node's plugin ones.
#[utoipa::path(get, path = "/api/v1/expectations", operation_id = "list_expectations", tag = "verdicts", security(("bearer" = [])), params(ExpectationFilter),
    responses((status = 200, body = [Expectation]), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<ExpectationFilter>,
) -> ApiResult<Json<Vec<Expectation>>> {
    caller.require(Role::Viewer)?;
    let mut out = operators::all(&state.db).await?;
    if let Some(key) = &f.node {
        let node = db::resolve_node(&state.db, key).await?;
        out.extend(table::from_plugins(&state.db, node).await?);
    }
    out.extend(table::builtin_table());
    out.retain(|e| {
        f.test.as_ref().is_none_or(|t| &e.test == t)
            && f.origin.as_ref().is_none_or(|o| &e.origin == o)
    });
    Ok(Json(out))
}

/// Delete an operator expectation.
#[utoipa::path(delete, path = "/api/v1/expectations/{id}", tag = "verdicts", security(("bearer" = [])),
    params(("id" = Uuid, Path)), responses((status = 204), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<StatusCode> {
    caller.require(Role::Operator)?;
    let mut tx = state.db.begin().await?;
    let gone = operators::delete(&mut tx, id).await?;
    let (test, metric) = gone.ok_or_else(|| ApiError::NotFound(format!("no expectation {id}")))?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "expectation.delete",
        &format!("expectation:{id}"),
        serde_json::json!({"test": test, "metric": metric}),
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
