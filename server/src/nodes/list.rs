//! The node list and its counts as SQL: one filter ([`NodeQuery`]), read a keyset page at a
//! time or counted, in one statement each.
//!
//! On 50,000 nodes a page walks the hostname index and stops after `limit` matches (about
//! 1–5 ms; a free-text search that matches nothing reads every row, about 50 ms), and the
//! counts are one scan (about 10 ms). No filter here can use an index of its own: liveness
//! and problems depend on `now()`.
//!
//! The statements are built at run time (the node columns and the filter are shared by the
//! page and the counts), so sqlx cannot check them when compiling: every filter is bound in
//! both statements on every call. `server/tests/api.rs` runs every filter through the page,
//! `server/tests/lists.rs` free text, problems and the counts.

use std::time::Duration;

use heddle_types::nodes::{Liveness, NodeCounts};
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::{PgPool, Postgres};

use super::{NODE_SELECT, NodeRow};
use crate::db;

/// Which nodes to list or count; `None` is no filter. Values are checked by the caller.
#[derive(Debug, Default)]
pub struct NodeQuery<'a> {
    /// A substring of the host name (case-insensitive).
    pub hostname: Option<&'a str>,
    pub gpu_model: Option<&'a str>,
    pub min_gpus: Option<i32>,
    pub hca: Option<&'a str>,
    pub port_state: Option<&'a str>,
    /// `none`: nodes with no RDMA port.
    pub link_layer: Option<&'a str>,
    pub site: Option<&'a str>,
    /// A trait's key and value.
    pub trait_: Option<(&'a str, &'a str)>,
    pub liveness: Option<Liveness>,
    /// Free text, matched as a substring of the host name, GPU model, site, an HCA or a
    /// `key=value` trait (case-insensitive; its wildcards are taken literally).
    pub text: Option<&'a str>,
    /// Only nodes with a problem (`true`) or without one (`false`).
    pub problems: Option<bool>,
}

/// A node with a problem, in SQL: the rule of `NodeSummary::problems` (heddle-types), with
/// `$13` the age in seconds past which an agent is no longer online.
const PROBLEM_SQL: &str =
    "(n.last_seen_at IS NULL OR n.last_seen_at < now() - make_interval(secs => $13)
    OR n.facts_updated_at IS NULL OR NOT n.port_states <@ ARRAY['ACTIVE'])";

/// Every filter of [`NodeQuery`]; the parameters are bound by [`Bound::bind`].
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

/// A query's values as its SQL binds them.
struct Bound<'a> {
    q: &'a NodeQuery<'a>,
    /// `text` as an ILIKE pattern, its wildcards escaped.
    pattern: Option<String>,
    trait_json: Option<serde_json::Value>,
    min_age: Option<f64>,
    max_age: Option<f64>,
    /// Heartbeat ages in seconds up to which a node is online, then stale.
    online_secs: f64,
    stale_secs: f64,
}

impl<'a> Bound<'a> {
    fn new(q: &'a NodeQuery<'a>, heartbeat: Duration) -> Self {
        let (min_age, max_age) = match q.liveness {
            None => (None, None),
            Some(l) => db::liveness_age_bounds(l, heartbeat),
        };
        let (online_secs, stale_secs) = db::liveness_thresholds(heartbeat);
        Bound {
            q,
            pattern: q.text.map(|t| {
                format!(
                    "%{}%",
                    t.replace('\\', "\\\\")
                        .replace('%', "\\%")
                        .replace('_', "\\_")
                )
            }),
            trait_json: q.trait_.map(|(k, v)| serde_json::json!({ k: v })),
            min_age,
            max_age,
            online_secs,
            stale_secs,
        }
    }

    fn bind<'q, O>(
        &'q self,
        query: QueryAs<'q, Postgres, O, PgArguments>,
    ) -> QueryAs<'q, Postgres, O, PgArguments> {
        query
            .bind(self.q.hostname)
            .bind(self.q.gpu_model)
            .bind(self.q.min_gpus)
            .bind(self.q.hca)
            .bind(self.q.port_state)
            .bind(self.q.link_layer)
            .bind(self.q.site)
            .bind(self.trait_json.clone())
            .bind(self.min_age)
            .bind(self.max_age)
            .bind(self.pattern.as_deref())
            .bind(self.q.problems)
            .bind(self.online_secs)
            .bind(self.stale_secs)
    }
}

/// Up to `limit` matching nodes by host name, after the host name `after`.
pub async fn page(
    db: &PgPool,
    q: &NodeQuery<'_>,
    heartbeat: Duration,
    after: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<NodeRow>> {
    let sql = format!(
        "{NODE_SELECT} WHERE {} AND ($15::text IS NULL OR n.hostname > $15)
         ORDER BY n.hostname LIMIT $16",
        filter_sql()
    );
    let bound = Bound::new(q, heartbeat);
    bound
        .bind(sqlx::query_as(&sql))
        .bind(after)
        .bind(limit)
        .fetch_all(db)
        .await
}

/// How many nodes match, by liveness and with problems, and how many there are in all.
pub async fn counts(
    db: &PgPool,
    q: &NodeQuery<'_>,
    heartbeat: Duration,
) -> sqlx::Result<NodeCounts> {
    let sql = format!(
        "SELECT (SELECT count(*) FROM nodes), count(*),
           count(*) FILTER (WHERE n.last_seen_at >= now() - make_interval(secs => $13)),
           count(*) FILTER (WHERE n.last_seen_at < now() - make_interval(secs => $13)
                              AND n.last_seen_at >= now() - make_interval(secs => $14)),
           count(*) FILTER (WHERE {PROBLEM_SQL})
         FROM nodes n LEFT JOIN sites s ON s.id = n.site_id WHERE {}",
        filter_sql()
    );
    let bound = Bound::new(q, heartbeat);
    let (fleet, total, online, stale, problems): (i64, i64, i64, i64, i64) =
        bound.bind(sqlx::query_as(&sql)).fetch_one(db).await?;
    Ok(NodeCounts {
        fleet,
        total,
        online,
        stale,
        offline: total - online - stale,
        problems,
    })
}
