//! A series over time, for its chart (`GET /regressions/series`, the dashboard's series
//! view): its figures in a range, its change points there, and the node's facts changes
//! there as markers on the time axis. [`chart`] is the one read of a range of a series: what
//! it returns is bounded by [`MAX_CHART_POINTS`] however long the range.

use chrono::{DateTime, Utc};
use heddle_types::regress::{ChartPoint, FactsMarker, MAX_CHART_POINTS, SeriesChart, facts_diff};
use sqlx::PgPool;
use uuid::Uuid;

use super::{SERIES_FIGURES, SeriesKey, store};
use crate::health::HealthError;

/// Facts snapshots read for markers at most; a node keeps `HEDDLE_FACTS_HISTORY_KEEP`
/// (default 100) anyway.
const MAX_SNAPSHOTS: i64 = 1000;

#[derive(sqlx::FromRow)]
struct Row {
    t: DateTime<Utc>,
    value: f64,
    result_id: Uuid,
    run_id: Uuid,
    total: i64,
}

/// The chart of `key` within `[since, until]` (no `since`: from the series' first point).
/// More than [`MAX_CHART_POINTS`] points in the range are thinned to every `stride`-th,
/// counted back from the newest so the latest result is always drawn; levels and change
/// points come from the detector's stored changes, which saw every point.
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
    let hostname: Option<(String,)> = sqlx::query_as("SELECT hostname FROM nodes WHERE id = $1")
        .bind(key.node_id)
        .fetch_optional(db)
        .await?;
    let Some((hostname,)) = hostname else {
        return Err(no_such_series(key));
    };
    let sql = format!(
        "SELECT t, value, result_id, run_id, total FROM (
             SELECT r.received_at AS t, (f->>'value')::float8 AS value, r.id AS result_id, v.run_id,
                    row_number() OVER (ORDER BY r.received_at DESC, r.id DESC) AS newest, count(*) OVER () AS total
             {SERIES_FIGURES}
               AND ($7::timestamptz IS NULL OR r.received_at >= $7) AND r.received_at <= $8
         ) s
         WHERE (newest - 1) % greatest(1, ceil(total::float8 / $9))::bigint = 0
         ORDER BY t, result_id"
    );
    let rows: Vec<Row> = key
        .bind(sqlx::query_as(&sql))
        .bind(since)
        .bind(until)
        .bind(MAX_CHART_POINTS as i64)
        .fetch_all(db)
        .await?;
    let total = rows.first().map_or(0, |r| r.total);
    if total == 0 && !exists(db, key).await? {
        return Err(no_such_series(key));
    }
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
        stride: stride(total),
        total_points: total,
        points: rows
            .into_iter()
            .map(|r| ChartPoint {
                t: r.t,
                value: r.value,
                result_id: r.result_id,
                run_id: r.run_id,
            })
            .collect(),
        change_points: store::of_series(db, key, since, until).await?,
        facts_markers: facts_markers(db, key.node_id, since, until).await?,
    })
}

/// Every how many points one is drawn when the range holds `total`: what the query's
/// `greatest(1, ceil(total / MAX_CHART_POINTS))` computes.
fn stride(total: i64) -> i64 {
    (total.max(0) as u64)
        .div_ceil(MAX_CHART_POINTS as u64)
        .max(1) as i64
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

/// Whether the series has any point at all, whatever the range.
async fn exists(db: &PgPool, key: &SeriesKey) -> Result<bool, sqlx::Error> {
    let sql = format!("SELECT EXISTS (SELECT 1 {SERIES_FIGURES})");
    let (found,): (bool,) = key.bind(sqlx::query_as(&sql)).fetch_one(db).await?;
    Ok(found)
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
    let mut snapshots: Vec<(DateTime<Utc>, i64, serde_json::Value)> = sqlx::query_as(
        "(SELECT collected_at, id, facts FROM node_facts_history
           WHERE node_id = $1 AND collected_at < $2 ORDER BY collected_at DESC, id DESC LIMIT 1)
         UNION ALL
         (SELECT collected_at, id, facts FROM node_facts_history
           WHERE node_id = $1 AND collected_at >= coalesce($2, '-infinity') AND collected_at <= $3
           ORDER BY collected_at, id LIMIT $4)",
    )
    .bind(node_id)
    .bind(since)
    .bind(until)
    .bind(MAX_SNAPSHOTS)
    .fetch_all(db)
    .await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stride_keeps_at_most_the_bound() {
        assert_eq!(stride(0), 1);
        assert_eq!(stride(1), 1);
        assert_eq!(stride(MAX_CHART_POINTS as i64), 1);
        assert_eq!(stride(MAX_CHART_POINTS as i64 + 1), 2);
        for total in [999, 1000, 1001, 2999, 3000, 3001, 100_000] {
            let kept = (total as u64).div_ceil(stride(total) as u64);
            assert!(kept <= MAX_CHART_POINTS as u64, "{total}: {kept}");
        }
    }
}
