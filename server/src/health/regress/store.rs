//! Reading stored change points: the regressions list, one series' changes for its chart, a
//! node's open regressions as health reasons, and per-node counts for the fleet view and
//! `/metrics`.

use chrono::{DateTime, Utc};
use heddle_types::health::{Reason, Severity};
use heddle_types::regress::{self, FactChange, FleetView, Regression};
use sqlx::PgPool;
use uuid::Uuid;

use super::SeriesKey;
use crate::health::HealthError;

/// The most rows one list answers.
pub const MAX_LIMIT: i64 = 1000;

/// A change point as every read of them selects it.
struct Row {
    id: Uuid,
    node_id: Uuid,
    hostname: String,
    test: String,
    metric: String,
    size_band: i32,
    world_size: i32,
    pair: String,
    t: DateTime<Utc>,
    before: f64,
    after: f64,
    relative_change: f64,
    ci_low: f64,
    ci_high: f64,
    points_before: i32,
    points_after: i32,
    worse: bool,
    latest: bool,
    facts_changes: sqlx::types::Json<Vec<FactChange>>,
    fleet: sqlx::types::Json<serde_json::Value>,
    detected_at: DateTime<Utc>,
}

impl From<Row> for Regression {
    fn from(r: Row) -> Self {
        let mut out = Regression {
            id: r.id,
            node_id: r.node_id,
            hostname: r.hostname,
            test: r.test,
            metric: r.metric,
            size_band: r.size_band,
            world_size: r.world_size,
            pair: Some(r.pair).filter(|p| !p.is_empty()),
            t: r.t,
            before: r.before,
            after: r.after,
            relative_change: r.relative_change,
            ci_low: r.ci_low,
            ci_high: r.ci_high,
            points_before: r.points_before,
            points_after: r.points_after,
            worse: r.worse,
            open: r.worse && r.latest,
            facts_changes: r.facts_changes.0,
            // A view not computed yet (`{}`) reads as empty.
            fleet: serde_json::from_value::<FleetView>(r.fleet.0).unwrap_or_default(),
            summary: String::new(),
            detected_at: r.detected_at,
        };
        out.summary = regress::summary(&out);
        out
    }
}

/// What a list asks for; `node` already resolved.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub node_id: Option<Uuid>,
    pub since: Option<DateTime<Utc>>,
    /// A kind (`nccl`) or a test (`nccl.all_reduce`).
    pub kind: Option<String>,
    /// Closed ones and improvements too.
    pub all: bool,
    pub limit: i64,
}

/// Regressions newest first: open ones, or every change with `all`.
pub async fn list(db: &PgPool, f: &Filter) -> Result<Vec<Regression>, HealthError> {
    let rows = sqlx::query_as!(
        Row,
        r#"SELECT c.id, c.node_id, n.hostname, c.test, c.metric, c.size_band, c.world_size, c.pair,
                c.t, c.before, c.after, c.relative_change, c.ci_low, c.ci_high, c.points_before,
                c.points_after, c.worse, c.latest,
                c.facts_changes AS "facts_changes: sqlx::types::Json<Vec<FactChange>>",
                c.fleet AS "fleet: sqlx::types::Json<serde_json::Value>", c.detected_at
         FROM change_points c JOIN nodes n ON n.id = c.node_id
         WHERE ($1 OR (c.worse AND c.latest))
           AND ($2::uuid IS NULL OR c.node_id = $2)
           AND ($3::timestamptz IS NULL OR c.t >= $3)
           AND ($4::text IS NULL OR c.test = $4 OR c.test LIKE $4 || '.%')
         ORDER BY c.t DESC, c.id LIMIT $5"#,
        f.all,
        f.node_id,
        f.since,
        f.kind,
        f.limit.clamp(1, MAX_LIMIT),
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Every change of one series within `[since, until]`, oldest first: open, closed and
/// improvements. The detector keeps a series' changes within its newest
/// [`heddle_types::regress::detect::MAX_POINTS`] points, so there are few.
pub async fn of_series(
    db: &PgPool,
    key: &SeriesKey,
    since: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
) -> Result<Vec<Regression>, HealthError> {
    let rows = sqlx::query_as!(
        Row,
        r#"SELECT c.id, c.node_id, n.hostname, c.test, c.metric, c.size_band, c.world_size, c.pair,
                c.t, c.before, c.after, c.relative_change, c.ci_low, c.ci_high, c.points_before,
                c.points_after, c.worse, c.latest,
                c.facts_changes AS "facts_changes: sqlx::types::Json<Vec<FactChange>>",
                c.fleet AS "fleet: sqlx::types::Json<serde_json::Value>", c.detected_at
         FROM change_points c JOIN nodes n ON n.id = c.node_id
         WHERE c.node_id = $1 AND c.test = $2 AND c.metric = $3 AND c.size_band = $4 AND c.world_size = $5
           AND c.pair = $6 AND ($7::timestamptz IS NULL OR c.t >= $7) AND c.t <= $8
         ORDER BY c.t, c.id LIMIT $9"#,
        key.node_id,
        key.test,
        key.metric,
        key.band,
        key.world_size,
        key.pair,
        since,
        until,
        MAX_LIMIT,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// A node's open regressions as health reasons (code `regression`), newest first.
pub async fn node_reasons(
    db: &PgPool,
    node_id: Uuid,
    severity: Severity,
) -> Result<Vec<Reason>, HealthError> {
    let open = list(
        db,
        &Filter {
            node_id: Some(node_id),
            limit: 50,
            ..Filter::default()
        },
    )
    .await?;
    Ok(open
        .into_iter()
        .map(|r| Reason {
            severity,
            metric: Some(format!("{}/{}", r.test, r.metric)),
            observed: Some(r.after),
            expected: Some(r.before),
            basis: "regression".into(),
            code: Some(regress::REGRESSION_CODE.into()),
            evidence: None,
            message: r.summary,
        })
        .collect())
}

/// Open regressions per node and test, for the fleet view and `/metrics`: a p2p test's
/// counts every GPU pair's (the list names them).
pub async fn open_by_node(db: &PgPool) -> Result<Vec<(Uuid, String, String, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT c.node_id, n.hostname, c.test, count(*) AS "open!"
         FROM change_points c JOIN nodes n ON n.id = c.node_id
         WHERE c.worse AND c.latest GROUP BY c.node_id, n.hostname, c.test"#,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.node_id, r.hostname, r.test, r.open))
        .collect())
}
