//! The site's fabric: an admin imports it from a topology file, anyone who reads may read
//! it back (`fabric.rs` reads, checks and stores it); operators start fabric
//! investigations over it (`investigate/fabric.rs`).

use axum::extract::State;
use axum::http::StatusCode;
use heddle_types::auth::Role;
use heddle_types::fabric::investigation::{FabricInvestigation, FabricInvestigationCreate};
use heddle_types::fabric::stored::{FabricImport, FabricSummary, StoredFabric};
use serde::Deserialize;
use uuid::Uuid;

use crate::fabric;
use crate::http::auth::Caller;
use crate::http::error::{ApiResult, Json, Path, Query};
use crate::investigate::fabric as investigation;
use crate::state::AppState;

/// Import the site's fabric from a Heddle fabric file, Slurm's `topology.conf` or
/// `ibnetdiscover`'s output, replacing the one stored. A text that does not read is
/// refused with every bad line or item named, and nothing is stored.
#[utoipa::path(put, path = "/api/v1/fabric", tag = "fabric", security(("bearer" = [])), request_body = FabricImport,
    responses((status = 200, body = FabricSummary), (status = 403, body = heddle_types::ErrorBody),
        (status = 413, body = heddle_types::ErrorBody), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn import_fabric(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<FabricImport>,
) -> ApiResult<Json<FabricSummary>> {
    caller.require(Role::Admin)?;
    let parsed = fabric::read(req.source, req.text).await?;
    let summary = fabric::store(&state.db, &parsed, req.source, &caller.actor()).await?;
    Ok(Json(summary))
}

/// The site's fabric and where it came from; 404 until one is imported.
#[utoipa::path(get, path = "/api/v1/fabric", tag = "fabric", security(("bearer" = [])),
    responses((status = 200, body = StoredFabric), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_fabric(
    State(state): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<StoredFabric>> {
    caller.require(Role::Viewer)?;
    Ok(Json(fabric::current(&state.db).await?))
}

/// Find the broken part of the fabric behind some suspect nodes: round by round, NCCL
/// all_reduce tests along the fabric chosen to split what could be at fault, until a NIC
/// or cable, node, leaf, uplink or spine is blamed with confidence or nothing can tell the
/// candidates apart.
#[utoipa::path(post, path = "/api/v1/fabric/investigations", tag = "fabric", security(("bearer" = [])),
    request_body = FabricInvestigationCreate,
    responses((status = 201, body = FabricInvestigation), (status = 404, body = heddle_types::ErrorBody),
        (status = 422, body = heddle_types::ErrorBody)))]
pub async fn create_fabric_investigation(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<FabricInvestigationCreate>,
) -> ApiResult<(StatusCode, Json<FabricInvestigation>)> {
    caller.require(Role::Operator)?;
    // A node is tested while it is online (`db::liveness`).
    let (online_s, _) = crate::db::liveness_thresholds(state.config.heartbeat_interval());
    let id = investigation::create(&state.db, &caller.actor(), &req, online_s).await?;
    Ok((
        StatusCode::CREATED,
        Json(investigation::load(&state.db, id).await?),
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct FabricInvestigationFilter {
    limit: Option<i64>,
}

/// Recent fabric investigations, newest first, with what they blamed (without their tests).
#[utoipa::path(get, path = "/api/v1/fabric/investigations", tag = "fabric", security(("bearer" = [])),
    params(FabricInvestigationFilter), responses((status = 200, body = [FabricInvestigation])))]
pub async fn list_fabric_investigations(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<FabricInvestigationFilter>,
) -> ApiResult<Json<Vec<FabricInvestigation>>> {
    caller.require(Role::Viewer)?;
    Ok(Json(
        investigation::list(&state.db, super::limit(f.limit, 20)).await?,
    ))
}

/// One fabric investigation: its rounds' tests with their figures, and what it blames,
/// where in the fabric, and how sure it is.
#[utoipa::path(get, path = "/api/v1/fabric/investigations/{id}", tag = "fabric", security(("bearer" = [])),
    params(("id" = Uuid, Path)),
    responses((status = 200, body = FabricInvestigation), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn get_fabric_investigation(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<Uuid>,
) -> ApiResult<Json<FabricInvestigation>> {
    caller.require(Role::Viewer)?;
    Ok(Json(investigation::load(&state.db, id).await?))
}
