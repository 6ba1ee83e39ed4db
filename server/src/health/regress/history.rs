//! A series over time, for its chart (`GET /regressions/series`, the dashboard's series
//! view): its figures in a range, its change points there, and the node's facts changes
//! there as markers on the time axis. [`chart`] is the one read of a range of a series: what
//! it returns is bounded by [`MAX_CHART_POINTS`] however long the range.

use chrono::{DateTime, Utc};
use heddle_types::regress::{
    ChartPoint, FactsMarker, MAX_CHART_POINTS, Resolution, SeriesChart, facts_diff,
};
use sqlx::PgPool;
use uuid::Uuid;

use super::{SeriesKey, store};
use crate::health::HealthError;
use crate::history;

/// Facts snapshots read for markers at most; a node keeps `HEDDLE_FACTS_HISTORY_KEEP`
/// (default 100) anyway.
const MAX_SNAPSHOTS: i64 = 1000;

/// The chart of `key` within `[since, until]` (no `since`: from the series' first day),
/// read through [`history::range`]: a result's figure per point for a range of at most
/// [`heddle_types::regress::RAW_MAX_DAYS`] days, a day per point (its median, count and
/// extremes, from the rollups) for longer ones. More than [`MAX_CHART_POINTS`] in the range
/// are thinned to every `stride`-th, counted back from the newest so the latest is always
/// drawn; levels and change points come from the detector's stored changes, which saw every
/// point.
pub async fn chart(
    db: &PgPool,
    key: &SeriesKey,
    since: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
) -> Result<SeriesChart, HealthError> {
    if let Some(since) = since
        && since > until
    {
        return Err(HealthError::Invalid(format!(
            "since ({since}) is after until ({until})"
        )));
    }
    let hostname = sqlx::query_scalar!("SELECT hostname FROM nodes WHERE id = $1", key.node_id)
        .fetch_optional(db)
        .await?;
    let Some(hostname) = hostname else {
        return Err(no_such_series(key));
    };
    let range = history::range(db, key, since, until, MAX_CHART_POINTS).await?;
    if range.total == 0 && !history::range::exists(db, key).await? {
        return Err(no_such_series(key));
    }
    let days = range.resolution == Resolution::Days;
    Ok(SeriesChart {
        node_id: key.node_id,
        hostname,
        test: key.test.clone(),
        metric: key.metric.clone(),
        size_band: key.band,
        world_size: key.world_size,
        pair: Some(key.pair.clone()).filter(|p| !p.is_empty()),
        since,
        until,
        resolution: range.resolution,
        stride: range.stride,
        total_points: range.total,
        points: range
            .buckets
            .into_iter()
            .map(|b| ChartPoint {
                t: b.t,
                value: b.median,
                result_id: b.result_id,
                run_id: b.run_id,
                n: days.then_some(b.n),
                min: days.then_some(b.min),
                max: days.then_some(b.max),
            })
            .collect(),
        change_points: store::of_series(db, key, since, until).await?,
        facts_markers: facts_markers(db, key.node_id, since, until).await?,
    })
}

fn no_such_series(key: &SeriesKey) -> HealthError {
    let pair = if key.pair.is_empty() {
        String::new()
    } else {
        format!(" of pair {}", key.pair)
    };
    HealthError::NoSuchSeries(format!(
        "the node has no figures of {} {}{pair} in band 2^{} with world size {}",
        key.test, key.metric, key.band, key.world_size
    ))
}

/// The node's facts changes within the range: each snapshot against the one before it (the
/// last one before `since` for the first), the fields regressions compare (driver, CUDA,
/// NCCL, kernel, firmware, ...); snapshots that changed none of them make no marker.
async fn facts_markers(
    db: &PgPool,
    node_id: Uuid,
    since: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
) -> Result<Vec<FactsMarker>, sqlx::Error> {
    let mut snapshots: Vec<(DateTime<Utc>, i64, serde_json::Value)> = sqlx::query!(
        r#"(SELECT collected_at AS "collected_at!", id AS "id!", facts AS "facts!"
           FROM node_facts_history
           WHERE node_id = $1 AND collected_at < $2 ORDER BY collected_at DESC, id DESC LIMIT 1)
         UNION ALL
         (SELECT collected_at, id, facts FROM node_facts_history
           WHERE node_id = $1 AND collected_at >= coalesce($2, '-infinity') AND collected_at <= $3
           ORDER BY collected_at, id LIMIT $4)"#,
        node_id,
        since,
        until,
        MAX_SNAPSHOTS,
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|s| (s.collected_at, s.id, s.facts))
    .collect();
    snapshots.sort_by_key(|s| (s.0, s.1));
    let mut markers = Vec::new();
    let mut before = None;
    for (t, _, facts) in snapshots {
        let now = facts_diff::fields(&facts);
        if let Some(prev) = before.replace(now.clone()) {
            let changes = facts_diff::diff(&prev, &now);
            if !changes.is_empty() {
                markers.push(FactsMarker { t, changes });
            }
        }
    }
    Ok(markers)
}
