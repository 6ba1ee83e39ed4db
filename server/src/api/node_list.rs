//! The node list and its counts: one filter (`NodeFilter`), answered a keyset page at a time
//! by `GET /api/v1/nodes` and counted by `GET /api/v1/nodes/counts`, so a page showing the
//! first rows of 50,000 nodes can say truthfully how many match. The statements are
//! `nodes::list`'s.

use axum::extract::State;
use heddle_types::auth::Role;
use heddle_types::nodes::{NodeCounts, NodeSummary};
use serde::Deserialize;

use crate::api::page::{self, Page};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Query};
use crate::nodes::list::{self, NodeQuery};
use crate::state::AppState;

/// Longest free-text search (`q`) accepted.
const MAX_QUERY_CHARS: usize = 200;

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct NodeFilter {
    /// Free text (case-insensitive): a substring of the hostname, GPU model, site, an HCA
    /// or a `key=value` trait. At most 200 characters, no control characters.
    q: Option<String>,
    /// Substring of the hostname (case-insensitive).
    hostname: Option<String>,
    /// Exact GPU model, e.g. `NVIDIA H200`.
    gpu_model: Option<String>,
    /// Nodes with at least this many GPUs.
    min_gpus: Option<i32>,
    /// Nodes that have this HCA, e.g. `mlx5_0`.
    hca: Option<String>,
    /// Nodes with at least one port in this state, e.g. `ACTIVE` or `DOWN`.
    port_state: Option<String>,
    /// Nodes with at least one port of this link layer: `InfiniBand` or `Ethernet`; `none`
    /// for nodes with no RDMA port.
    link_layer: Option<String>,
    site: Option<String>,
    /// `key=value` site trait set by plugins, e.g. `cloud=azure`.
    #[serde(rename = "trait")]
    trait_: Option<String>,
    /// The agent's liveness: `online`, `stale` or `offline`.
    liveness: Option<String>,
    /// Deprecated: the first name of `liveness`.
    #[deprecated = "the first name of `liveness`"]
    health: Option<String>,
    /// `true`: only nodes with a problem (agent not online, no facts yet, or a port not
    /// `ACTIVE`); `false`: only nodes without one.
    problems: Option<bool>,
    /// Nodes per page (default 500, at most 1000); the counts ignore it.
    limit: Option<i64>,
    /// Where the next page starts: the `x-next-cursor` of the previous page; the counts
    /// ignore it.
    cursor: Option<String>,
}

impl NodeFilter {
    /// The filter as the node list's query, or why it cannot be one.
    #[allow(deprecated)] // reads `health`, the first name of `liveness`
    fn query(&self) -> Result<NodeQuery<'_>, ApiError> {
        let trait_ = match &self.trait_ {
            None => None,
            Some(kv) => Some(kv.split_once('=').ok_or_else(|| {
                ApiError::BadRequest(format!("trait filter {kv:?} must be key=value"))
            })?),
        };
        let liveness = match (self.liveness.as_deref(), self.health.as_deref()) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::BadRequest(format!(
                    "liveness={a} and health={b} disagree; health is liveness's first name, \
                     give liveness alone"
                )));
            }
            (Some(l), _) | (None, Some(l)) => Some(l.parse().map_err(ApiError::BadRequest)?),
            (None, None) => None,
        };
        let text = match self.q.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(q) if q.chars().count() > MAX_QUERY_CHARS => {
                return Err(ApiError::BadRequest(format!(
                    "q must be at most {MAX_QUERY_CHARS} characters"
                )));
            }
            Some(q) if q.chars().any(char::is_control) => {
                return Err(ApiError::BadRequest(
                    "q holds a control character (newline, tab, NUL...)".into(),
                ));
            }
            Some(q) => Some(q),
        };
        Ok(NodeQuery {
            hostname: self.hostname.as_deref(),
            gpu_model: self.gpu_model.as_deref(),
            min_gpus: self.min_gpus,
            hca: self.hca.as_deref(),
            port_state: self.port_state.as_deref(),
            link_layer: self.link_layer.as_deref(),
            site: self.site.as_deref(),
            trait_,
            liveness,
            text,
            problems: self.problems,
        })
    }
}

/// List nodes by hostname, filtered by the facts people ask about, a page at a time.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", security(("bearer" = [])), params(NodeFilter),
    responses((status = 200, body = [NodeSummary], headers(("x-next-cursor" = String,
            description = "present when there are more nodes: pass it as `cursor` (with the same filters) for the next page"))),
        (status = 400, body = heddle_types::ErrorBody)))]
pub async fn list_nodes(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<NodeFilter>,
) -> ApiResult<Page<NodeSummary>> {
    caller.require(Role::Viewer)?;
    let hb = state.config.heartbeat_interval();
    let after = f.cursor.as_deref().map(page::decode).transpose()?;
    let limit = super::limit(f.limit, 500);
    let rows = list::page(&state.db, &f.query()?, hb, after.as_deref(), limit + 1).await?;
    Ok(Page::of(rows, limit, |r| r.hostname.clone()).map(|r| r.summary(hb)))
}

/// How many nodes match the filters of `GET /api/v1/nodes` (the same parameters; `limit`
/// and `cursor` are ignored), by health and with problems, and how many there are in all.
#[utoipa::path(get, path = "/api/v1/nodes/counts", tag = "nodes", security(("bearer" = [])), params(NodeFilter),
    responses((status = 200, body = NodeCounts), (status = 400, body = heddle_types::ErrorBody)))]
pub async fn node_counts(
    State(state): State<AppState>,
    caller: Caller,
    Query(f): Query<NodeFilter>,
) -> ApiResult<Json<NodeCounts>> {
    caller.require(Role::Viewer)?;
    let hb = state.config.heartbeat_interval();
    Ok(Json(list::counts(&state.db, &f.query()?, hb).await?))
}
