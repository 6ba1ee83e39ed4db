//! The site's fabric: an admin imports it from a topology file, anyone who reads may read
//! it back (`fabric.rs` reads, checks and stores it).

use axum::extract::State;
use heddle_types::auth::Role;
use heddle_types::fabric::stored::{FabricImport, FabricSummary, StoredFabric};

use crate::fabric;
use crate::http::auth::Caller;
use crate::http::error::{ApiResult, Json};
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
