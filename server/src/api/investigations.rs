//! Investigations ("which node is bad?") and the GPU×GPU matrix of a `p2p` result. The
//! work is in `investigate`; these handlers check roles and shapes.

use axum::extract::State;
use axum::http::StatusCode;
use heddle_types::auth::Role;
use heddle_types::investigations::*;
use serde::Deserialize;
use uuid::Uuid;

use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::investigate::{self, THRESHOLDS};
use crate::state::AppState;

/// Test every pair of the given nodes with a two-node run and name the bad node or link.
#[utoipa::path(post, path = "/api/v1/investigations", tag = "investigations", security(("bearer" = [])),
    request_body = InvestigationCreate,
    responses((status = 201, body = Investigation), (status = 404, body = heddle_types::ErrorBody),
        (status = 422, body = heddle_types::ErrorBody)))]
pub async fn create_investigation(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<InvestigationCreate>,
) -> ApiResult<(StatusCode, Json<Investigation>)> {
    caller.require(Role::Operator)?;
    let id = investigate::create(&state.db, &caller.actor(), &req).await?;
    Ok((
        StatusCode::CREATED,
        Json(investigate::load(&state.db, id).await?),
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct InvestigationFilter {
    state: Option<InvestigationState>,
    limit: Option<i64>,
}

/// Recent investigations, newest first, with their verdict and culprits.
#[utoipa::path(get, path = "/api/v1/investigations", tag = "investigations", security(("bearer" = [])),
    params(InvestigationFilter), responses((status = 200, body = [InvestigationSummary])))]
pub async fn list_investigations(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<InvestigationFilter>,
) -> ApiResult<Json<Vec<InvestigationSummary>>> {
    caller.require(Role::Viewer)?;
    Ok(Json(
        investigate::list(&state.db, f.state, super::limit(f.limit, 20)).await?,
    ))
}

/// One investigation: progress, pairs and their runs, the matrix and the culprits.
#[utoipa::path(get, path = "/api/v1/investigations/{id}", tag = "investigations", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = Investigation), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_investigation(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<Investigation>> {
    caller.require(Role::Viewer)?;
    Ok(Json(investigate::load(&state.db, id).await?))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct P2pQuery {
    /// A GPU or GPU pair is named below this fraction of the median (default 0.75).
    threshold: Option<f64>,
}

/// The GPU×GPU device-to-device matrix of a `p2p` result, with the bad GPU or GPU pair.
#[utoipa::path(get, path = "/api/v1/results/{id}/p2p-matrix", tag = "investigations", security(("bearer" = [])),
    params(("id" = Uuid, Path), P2pQuery),
    responses((status = 200, body = P2pMatrix), (status = 404, body = heddle_types::ErrorBody),
        (status = 422, body = heddle_types::ErrorBody)))]
pub async fn p2p_matrix(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
    Query(q): Query<P2pQuery>,
) -> ApiResult<Json<P2pMatrix>> {
    caller.require(Role::Viewer)?;
    let threshold = q.threshold.unwrap_or(DEFAULT_THRESHOLD);
    if !THRESHOLDS.contains(&threshold) {
        return Err(ApiError::Unprocessable(format!(
            "threshold must be between {} and {}",
            THRESHOLDS.start(),
            THRESHOLDS.end()
        )));
    }
    Ok(Json(
        investigate::p2p::for_result(&state.db, id, threshold).await?,
    ))
}
