//! The node list and its counts: one filter (`NodeFilter`), answered a keyset page at a time
//! by `GET /api/v1/nodes` and counted by `GET /api/v1/nodes/counts`, so a page showing the
//! first rows of 50,000 nodes can say truthfully how many match.
//!
//! Both read `nodes` in one statement each. On 50,000 nodes a page walks the hostname index
//! and stops after `limit` matches (about 1–5 ms; a free-text search that matches nothing
//! reads every row, about 50 ms), and the counts are one scan (about 10 ms). No filter here
//! can use an index of its own: health and problems depend on `now()`.

use axum::extract::State;
use heddle_types::auth::Role;
use heddle_types::nodes::{NodeCounts, NodeSummary};
use serde::Deserialize;
use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;

use super::nodes::{NODE_SELECT, NodeRow};
use crate::api::page::{self, Page};
use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Query};
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
    /// `online`, `stale` or `offline`.
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

/// A filter checked and turned into the values its SQL binds.
struct Filters {
    f: NodeFilter,
    /// `q` as an ILIKE pattern, its wildcards escaped.
    pattern: Option<String>,
    trait_json: Option<serde_json::Value>,
    min_age: Option<f64>,
    max_age: Option<f64>,
    /// Heartbeat ages in seconds up to which a node is online, then stale.
    online_secs: f64,
    stale_secs: f64,
}

/// A node with a problem, in SQL: the rule of `NodeSummary::problems` (heddle-types), with
/// `$13` the age in seconds past which an agent is no longer online.
const PROBLEM_SQL: &str =
    "(n.last_seen_at IS NULL OR n.last_seen_at < now() - make_interval(secs => $13)
    OR n.facts_updated_at IS NULL OR NOT n.port_states <@ ARRAY['ACTIVE'])";

/// Every filter of [`NodeFilter`]; the parameters are bound by [`bind`].
fn filter_sql() -> String {
    format!(
        "($1::text IS NULL OR n.hostname ILIKE '%' || $1 || '%')
     AND ($2::text IS NULL OR n.gpu_model = $2)
     AND ($3::int IS NULL OR n.gpu_count >= $3)
     AND ($4::text IS NULL OR $4 = ANY(n.hcas))
     AND ($5::text IS NULL OR $5 = ANY(n.port_states))
     AND ($6::text IS NULL OR $6 = ANY(n.link_layers) OR ($6 = 'none' AND n.link_layers = '{{}}'))
     AND ($7::text IS NULL OR s.name = $7)
     AND ($8::jsonb IS NULL OR n.traits @> $8)
     AND ($9::float8 IS NULL OR coalesce(n.last_seen_at < now() - make_interval(secs => $9), true))
     AND ($10::float8 IS NULL OR n.last_seen_at >= now() - make_interval(secs => $10))
     AND ($11::text IS NULL OR n.hostname ILIKE $11 OR n.gpu_model ILIKE $11 OR s.name ILIKE $11
          OR array_to_string(n.hcas, E'\\n') ILIKE $11
          OR (n.traits <> '{{}}' AND EXISTS (SELECT 1 FROM jsonb_each_text(n.traits) t
                                            WHERE t.key || '=' || t.value ILIKE $11)))
     AND ($12::bool IS NULL OR $12 = {PROBLEM_SQL})"
    )
}

fn bind<'q, O>(
    q: QueryAs<'q, Postgres, O, PgArguments>,
    f: &'q Filters,
) -> QueryAs<'q, Postgres, O, PgArguments> {
    q.bind(f.f.hostname.as_deref())
        .bind(f.f.gpu_model.as_deref())
        .bind(f.f.min_gpus)
        .bind(f.f.hca.as_deref())
        .bind(f.f.port_state.as_deref())
        .bind(f.f.link_layer.as_deref())
        .bind(f.f.site.as_deref())
        .bind(f.trait_json.clone())
        .bind(f.min_age)
        .bind(f.max_age)
        .bind(f.pattern.as_deref())
        .bind(f.f.problems)
        .bind(f.online_secs)
        .bind(f.stale_secs)
}

impl Filters {
    fn check(f: NodeFilter, heartbeat: std::time::Duration) -> Result<Filters, ApiError> {
        let trait_json = match &f.trait_ {
            None => None,
            Some(kv) => {
                let (k, v) = kv.split_once('=').ok_or_else(|| {
                    ApiError::BadRequest(format!("trait filter {kv:?} must be key=value"))
                })?;
                Some(serde_json::json!({ k: v }))
            }
        };
        let (min_age, max_age) = match f.health.as_deref() {
            None => (None, None),
            Some(h) => db::health_age_bounds(h.parse().map_err(ApiError::BadRequest)?, heartbeat),
        };
        let pattern = match f.q.as_deref().map(str::trim) {
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
            Some(q) => Some(format!(
                "%{}%",
                q.replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
            )),
        };
        let (online_secs, stale_secs) = db::health_thresholds(heartbeat);
        Ok(Filters {
            f,
            pattern,
            trait_json,
            min_age,
            max_age,
            online_secs,
            stale_secs,
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
    let filters = Filters::check(f, hb)?;
    let sql = format!(
        "{NODE_SELECT} WHERE {} AND ($15::text IS NULL OR n.hostname > $15)
         ORDER BY n.hostname LIMIT $16",
        filter_sql()
    );
    let rows: Vec<NodeRow> = bind(sqlx::query_as(&sql), &filters)
        .bind(after)
        .bind(limit + 1)
        .fetch_all(&state.db)
        .await?;
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
    let filters = Filters::check(f, state.config.heartbeat_interval())?;
    let sql = format!(
        "SELECT (SELECT count(*) FROM nodes), count(*),
           count(*) FILTER (WHERE n.last_seen_at >= now() - make_interval(secs => $13)),
           count(*) FILTER (WHERE n.last_seen_at < now() - make_interval(secs => $13)
                              AND n.last_seen_at >= now() - make_interval(secs => $14)),
           count(*) FILTER (WHERE {PROBLEM_SQL})
         FROM nodes n LEFT JOIN sites s ON s.id = n.site_id WHERE {}",
        filter_sql()
    );
    let (fleet, total, online, stale, problems): (i64, i64, i64, i64, i64) =
        bind(sqlx::query_as(&sql), &filters)
            .fetch_one(&state.db)
            .await?;
    Ok(Json(NodeCounts {
        fleet,
        total,
        online,
        stale,
        offline: total - online - stale,
        problems,
    }))
}
