//! Regressions: nodes' figures that moved to a new level and stayed, each tied to what
//! changed on the node and in the fleet. Detection and storage are `health::regress`.

use axum::extract::State;
use chrono::{DateTime, Utc};
use heddle_types::auth::Role;
use heddle_types::regress::Regression;

use crate::db;
use crate::health::regress::store::{self, Filter};
use crate::http::auth::Caller;
use crate::http::error::{ApiResult, Json, Query};
use crate::state::AppState;

#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RegressionFilter {
    /// Only this node (id or hostname).
    node: Option<String>,
    /// Only changes at or after this time (RFC 3339).
    since: Option<DateTime<Utc>>,
    /// Only this test kind (`nccl`) or test (`nccl.all_reduce`).
    kind: Option<String>,
    /// Also improvements and changes a later change of the same series superseded.
    all: Option<bool>,
    /// At most this many (1 to 1000, default 100).
    limit: Option<i64>,
}

/// Open regressions (or every change with `all=true`), newest first: the levels before
/// and after with a 95 % interval, the node's facts and environment changes around it,
/// and how comparable nodes moved at the same time.
#[utoipa::path(get, path = "/api/v1/regressions", tag = "verdicts", security(("bearer" = [])),
    params(RegressionFilter),
    responses((status = 200, body = [Regression]), (status = 400, body = heddle_types::ErrorBody),
        (status = 404, body = heddle_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<RegressionFilter>,
) -> ApiResult<Json<Vec<Regression>>> {
    caller.require(Role::Viewer)?;
    let node_id = match &f.node {
        Some(key) => Some(db::resolve_node(&state.db, key).await?),
        None => None,
    };
    let filter = Filter {
        node_id,
        since: f.since,
        kind: f.kind,
        all: f.all.unwrap_or(false),
        limit: super::limit(f.limit, 100),
    };
    Ok(Json(store::list(&state.db, &filter).await?))
}
