//! Regressions: figures that moved to a new level and stayed (docs/health.md,
//! "Regressions"). After a result is judged, each series its figures belong to (node, test,
//! metric, size band, world size, GPU pair: `history::SeriesKey`) is read back from
//! `series_points`, at most [`detect::MAX_POINTS`] newest points, and
//! `heddle_types::regress::detect` runs on it: the work is that series' only. Its change
//! points replace the series' stored ones within the points read, each with the node's facts
//! and applied environment either side of it; `fleet.rs` then says how many comparable nodes
//! moved the same way and what they share. `store.rs` reads them;
//! `history.rs` reads a series over time for its chart.

pub mod fleet;
pub mod history;
pub mod store;

use chrono::{DateTime, Utc};
use heddle_types::health::{Expectation, Figure};
use heddle_types::regress::{self, Config, FactChange, detect, facts_diff};
use sqlx::PgPool;
use uuid::Uuid;

pub use crate::history::SeriesKey;

use super::HealthError;
use super::expectations::{self, Context};

/// The facts compared around a change are those of the results this many points away on
/// either side, so a change found a point or two off still straddles what caused it.
const FACTS_MARGIN: usize = 2;

/// A point of a series: a result's figure.
#[derive(Debug, Clone)]
pub(crate) struct Point {
    pub result_id: Uuid,
    pub received_at: DateTime<Utc>,
    pub value: f64,
}

/// Detects again every series a judged result added to (a succeeded result's figures:
/// its points). Returns how many change points the series now have. Called after
/// `verdict::judge_result`; safe to repeat.
pub async fn on_result(db: &PgPool, result_id: Uuid) -> Result<usize, HealthError> {
    let keys = sqlx::query_as!(
        SeriesKey,
        "SELECT DISTINCT node_id, test, metric, band, world_size, pair FROM series_points WHERE result_id = $1
         ORDER BY test, metric, band, pair",
        result_id,
    )
    .fetch_all(db)
    .await?;
    let mut found = 0;
    for key in keys {
        found += update_series(db, &key).await?;
    }
    Ok(found)
}

/// The series' newest points, oldest first.
async fn points(db: &PgPool, key: &SeriesKey) -> Result<Vec<Point>, sqlx::Error> {
    let mut points = sqlx::query_as!(
        Point,
        "SELECT result_id, t AS received_at, value FROM series_points
         WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6
         ORDER BY t DESC, result_id DESC LIMIT $7",
        key.node_id,
        key.test,
        key.metric,
        key.band,
        key.world_size,
        key.pair,
        detect::MAX_POINTS as i64,
    )
    .fetch_all(db)
    .await?;
    points.reverse();
    Ok(points)
}

/// The detector's settings for a series: the defaults, with the smallest change an
/// operator's `regression_min_change` expectation sets for its test or kind (one naming the
/// node first, then the exact test, then the newest).
async fn config(db: &PgPool, key: &SeriesKey) -> Result<Config, HealthError> {
    let kind = key.test.split('.').next().unwrap_or(&key.test).to_string();
    let tests = vec![key.test.clone(), kind];
    let operator = expectations::from_operators(db, &tests).await?;
    if !operator
        .iter()
        .any(|e| e.metric == regress::MIN_CHANGE_METRIC)
    {
        return Ok(Config::default());
    }
    let node = sqlx::query!(
        "SELECT hostname, gpu_model FROM nodes WHERE id = $1",
        key.node_id
    )
    .fetch_one(db)
    .await?;
    Ok(config_from(key, &operator, &node.hostname, node.gpu_model))
}

/// [`config`] from operator expectations already read (those of other tests are passed
/// over) and the node's hostname and GPU model.
pub(crate) fn config_from(
    key: &SeriesKey,
    operator: &[Expectation],
    hostname: &str,
    gpu_model: Option<String>,
) -> Config {
    let kind = key.test.split('.').next().unwrap_or(&key.test);
    let mut found: Vec<_> = operator
        .iter()
        .filter(|e| {
            e.metric == regress::MIN_CHANGE_METRIC && (e.test == key.test || e.test == kind)
        })
        .cloned()
        .collect();
    if found.is_empty() {
        return Config::default();
    }
    let ctx = Context {
        node_id: key.node_id,
        hostname: hostname.to_string(),
        gpu_model,
        world_size: key.world_size,
        ..Context::default()
    };
    let figure = Figure {
        test: key.test.clone(),
        metric: regress::MIN_CHANGE_METRIC.into(),
        size_bytes: 1i64 << key.band.clamp(0, 62),
        value: 0.0,
        pair: None,
    };
    found.retain(|e| {
        let mut as_test = e.clone();
        as_test.test = key.test.clone();
        as_test.gpu_count = None;
        expectations::applies(&as_test, &figure, &ctx)
    });
    found.sort_by_key(|e| {
        (
            e.node.is_none(),
            e.test != key.test,
            std::cmp::Reverse(e.created_at),
        )
    });
    Config {
        min_effect: found
            .first()
            .map_or(detect::DEFAULT_MIN_EFFECT, |e| e.value),
        ..Config::default()
    }
}

/// What differs on the node between two of its results: the compared facts fields as of
/// each result's arrival (the facts history), and the environment each test ran with.
async fn node_changes(
    db: &mut sqlx::PgConnection,
    node_id: Uuid,
    before: &Point,
    after: &Point,
) -> Result<Vec<FactChange>, sqlx::Error> {
    let mut facts = Vec::with_capacity(2);
    for at in [before.received_at, after.received_at] {
        facts.push(
            sqlx::query_scalar!(
                "SELECT facts FROM node_facts_history WHERE node_id = $1 AND collected_at <= $2
                 ORDER BY id DESC LIMIT 1",
                node_id,
                at,
            )
            .fetch_optional(&mut *db)
            .await?,
        );
    }
    let mut envs = Vec::with_capacity(2);
    for p in [before, after] {
        envs.push(
            sqlx::query_scalar!(
                "SELECT j.applied_env FROM results r JOIN jobs j ON j.id = r.job_id
                 WHERE r.id = $1 AND r.received_at = $2",
                p.result_id,
                p.received_at,
            )
            .fetch_optional(&mut *db)
            .await?,
        );
    }
    let mut changes = Vec::new();
    if let [Some(a), Some(b)] = &facts[..] {
        changes.extend(facts_diff::diff(
            &facts_diff::fields(a),
            &facts_diff::fields(b),
        ));
    }
    if let [Some(Some(a)), Some(Some(b))] = &envs[..] {
        changes.extend(facts_diff::diff(
            &facts_diff::env_fields(a),
            &facts_diff::env_fields(b),
        ));
    }
    Ok(changes)
}

/// Detects one series again and replaces its stored change points. Returns how many it has.
pub async fn update_series(db: &PgPool, key: &SeriesKey) -> Result<usize, HealthError> {
    let points = points(db, key).await?;
    if points.is_empty() {
        return Ok(0);
    }
    let cfg = config(db, key).await?;
    let mut tx = db.begin().await?;
    let (found, worse) = detect_and_store(&mut tx, key, &points, &cfg).await?;
    tx.commit().await?;
    refresh_cohorts(db, worse).await?;
    Ok(found)
}

/// Refreshes the cohorts of new worse change points ([`detect_and_store`]'s second
/// answer), after their transaction has committed.
pub(crate) async fn refresh_cohorts(db: &PgPool, worse: Vec<Uuid>) -> Result<(), HealthError> {
    for id in worse {
        fleet::refresh_cohort(db, id).await?;
    }
    Ok(())
}

/// Runs the detector on a series' newest `points` (oldest first, not empty) and replaces
/// its stored change points within them, through `conn` (the caller's transaction).
/// Returns how many it has, and the new worse ones, whose cohorts
/// [`refresh_cohorts`] refreshes once the transaction has committed.
pub(crate) async fn detect_and_store(
    conn: &mut sqlx::PgConnection,
    key: &SeriesKey,
    points: &[Point],
    cfg: &Config,
) -> Result<(usize, Vec<Uuid>), HealthError> {
    let values: Vec<f64> = points.iter().map(|p| p.value).collect();
    let changes = detect(&values, cfg);
    let mut rows = Vec::with_capacity(changes.len());
    for c in &changes {
        let before = &points[c.index.saturating_sub(1 + FACTS_MARGIN)];
        let after = &points[(c.index + FACTS_MARGIN).min(points.len() - 1)];
        let facts_changes = node_changes(&mut *conn, key.node_id, before, after).await?;
        rows.push((c, &points[c.index], facts_changes));
    }
    let times: Vec<DateTime<Utc>> = rows.iter().map(|r| r.1.received_at).collect();
    // Changes are found again only among the points read: older ones (before the newest
    // MAX_POINTS, or in months retention dropped) stay as they were found, and are no
    // longer the latest when a newer one is found.
    let Some(oldest) = points.first().map(|p| p.received_at) else {
        return Ok((0, Vec::new()));
    };
    // Only this series' rows, locked in key order by the unique index's scan.
    sqlx::query!(
        "DELETE FROM change_points WHERE node_id = $1 AND test = $2 AND metric = $3 AND size_band = $4
           AND world_size = $5 AND pair = $6 AND t >= $8 AND t <> ALL($7)",
        key.node_id,
        key.test,
        key.metric,
        key.band,
        key.world_size,
        key.pair,
        &times,
        oldest,
    )
    .execute(&mut *conn)
    .await?;
    if !rows.is_empty() {
        sqlx::query!(
            "UPDATE change_points SET latest = false WHERE node_id = $1 AND test = $2 AND metric = $3
               AND size_band = $4 AND world_size = $5 AND pair = $6 AND t < $7 AND latest",
            key.node_id,
            key.test,
            key.metric,
            key.band,
            key.world_size,
            key.pair,
            oldest,
        )
        .execute(&mut *conn)
        .await?;
    }
    let mut worse_ids = Vec::new();
    for (i, (c, first, facts_changes)) in rows.iter().enumerate() {
        let worse = regress::is_worse(&key.metric, c.relative_change);
        let facts = serde_json::to_value(facts_changes).map_err(|source| HealthError::Decode {
            what: "facts changes",
            source,
        })?;
        let stored = sqlx::query!(
            r#"INSERT INTO change_points (node_id, test, metric, size_band, world_size, pair, id, result_id, t, before,
                 after, relative_change, ci_low, ci_high, points_before, points_after, worse, latest, facts_changes)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
             ON CONFLICT (node_id, test, metric, size_band, world_size, pair, t) DO UPDATE SET
                 result_id = EXCLUDED.result_id, before = EXCLUDED.before, after = EXCLUDED.after,
                 relative_change = EXCLUDED.relative_change, ci_low = EXCLUDED.ci_low, ci_high = EXCLUDED.ci_high,
                 points_before = EXCLUDED.points_before, points_after = EXCLUDED.points_after,
                 worse = EXCLUDED.worse, latest = EXCLUDED.latest, facts_changes = EXCLUDED.facts_changes
             RETURNING id, (xmax = 0) AS "inserted!""#,
            key.node_id,
            key.test,
            key.metric,
            key.band,
            key.world_size,
            key.pair,
            Uuid::new_v4(),
            first.result_id,
            first.received_at,
            c.before,
            c.after,
            c.relative_change,
            c.low,
            c.high,
            c.points_before as i32,
            c.points_after as i32,
            worse,
            i + 1 == rows.len(),
            facts,
        )
        .fetch_one(&mut *conn)
        .await?;
        // A new change joins (or starts) its cohort; one seen before keeps the fleet view it
        // got then, updated when another node's change joins.
        if worse && stored.inserted {
            worse_ids.push(stored.id);
        }
    }
    if !rows.is_empty() {
        tracing::debug!(node = %key.node_id, test = %key.test, metric = %key.metric, band = key.band,
            pair = %key.pair, changes = rows.len(), "regressions detected again");
    }
    Ok((rows.len(), worse_ids))
}
