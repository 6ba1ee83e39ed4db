//! Regressions: nodes' figures that moved to a new level and stayed, each tied to what
//! changed on the node and in the fleet, and one series' chart. Detection, storage and
//! the chart's read are `health::regress`.

use axum::extract::State;
use chrono::{DateTime, Utc};
use heddle_types::auth::Role;
use heddle_types::regress::{Regression, SeriesChart};

use crate::db;
use crate::health::regress::store::{self, Filter};
use crate::health::regress::{SeriesKey, history};
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
#[utoipa::path(get, path = "/api/v1/regressions", operation_id = "list_regressions", tag = "verdicts", security(("bearer" = [])),
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

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    /// The node (id or hostname).
    node: String,
    /// The test (`nccl.all_reduce`).
    test: String,
    /// The metric (`busbw_gbs`).
    metric: String,
    /// The size band: the power of two the figures' message size falls in.
    band: i32,
    /// Nodes in the runs the figures come from.
    world_size: i32,
    /// The GPU pair of a per-pair series (`0-1`); absent or empty for the others.
    pair: Option<String>,
    /// From this time (RFC 3339); the series' first point when absent.
    since: Option<DateTime<Utc>>,
    /// Up to this time (RFC 3339); now when absent.
    until: Option<DateTime<Utc>>,
}

/// One series' chart: its figures over the range (at most 1,000, thinned evenly beyond),
/// its change points there (as the list gives them, improvements and closed ones too) and
/// the node's facts changes there, for markers on the time axis.
#[utoipa::path(get, path = "/api/v1/regressions/series", operation_id = "regression_series", tag = "verdicts", security(("bearer" = [])),
    params(SeriesQuery),
    responses((status = 200, body = SeriesChart), (status = 400, body = heddle_types::ErrorBody),
        (status = 404, body = heddle_types::ErrorBody), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn series(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<SeriesQuery>,
) -> ApiResult<Json<SeriesChart>> {
    caller.require(Role::Viewer)?;
    let key = SeriesKey {
        node_id: db::resolve_node(&state.db, &q.node).await?,
        test: q.test,
        metric: q.metric,
        band: q.band,
        world_size: q.world_size,
        pair: q.pair.unwrap_or_default(),
    };
    let until = q.until.unwrap_or_else(Utc::now);
    Ok(Json(history::chart(&state.db, &key, q.since, until).await?))
}
