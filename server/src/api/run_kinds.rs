//! The run-kinds catalogue: every job kind with its parameters (type, default, unit,
//! range, allowed values, help), generated from the parameter types in
//! `heddle_types::kinds`. The dashboard's launcher builds its form from it.

use heddle_types::kinds::catalogue;
use heddle_types::params::RunKind;

use crate::http::auth::Caller;
use crate::http::error::Json;

/// Every kind a run may have, and each kind's parameters.
#[utoipa::path(get, path = "/api/v1/run-kinds", tag = "runs", security(("bearer" = [])),
    responses((status = 200, body = Vec<RunKind>), (status = 401, body = heddle_types::ErrorBody)))]
pub async fn list_run_kinds(_caller: Caller) -> Json<Vec<RunKind>> {
    Json(catalogue())
}
