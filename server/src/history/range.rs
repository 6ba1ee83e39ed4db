//! A series over a time range, for charts: its points when the range is at most
//! [`RAW_MAX_DAYS`] long, its daily rollups when longer (a year of a nightly series is 365
//! rows of `series_daily` read through its primary key, whatever the fleet's size). Either
//! way at most a bound of them is answered, thinned evenly from the newest.

use chrono::{DateTime, NaiveDate, Utc};
pub use heddle_types::regress::{RAW_MAX_DAYS, Resolution};
use uuid::Uuid;

use super::SeriesKey;

/// A raw range reads at most this many points (its newest) before thinning them: a series
/// holds a few a day, so 30 days of it are far fewer; the bound keeps the read's plan an
/// ordered index scan that stops, whatever a hostile or runaway series holds.
pub const MAX_RAW_POINTS: i64 = 100_000;

/// A point of the series (`n` = 1, every level its value, `result_id` set, and `run_id`
/// while its verdict is kept) or a day of it (`t` is the day's 00:00 UTC).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Bucket {
    pub t: DateTime<Utc>,
    pub n: i64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// The day's median (of its 64 newest points), or the point's value.
    pub median: f64,
    pub result_id: Option<Uuid>,
    pub run_id: Option<Uuid>,
}

/// A range of a series as read: its buckets, oldest first, every `stride`-th of the `total`
/// the range holds counted back from the newest (so the latest is always there).
#[derive(Debug, Clone, PartialEq)]
pub struct Range {
    pub resolution: Resolution,
    pub buckets: Vec<Bucket>,
    pub total: i64,
    pub stride: i64,
}

/// Whether a range of `since..until` is read from the rollups.
pub fn reads_rollups(since: DateTime<Utc>, until: DateTime<Utc>) -> bool {
    until - since > chrono::Duration::days(RAW_MAX_DAYS)
}

/// Every how many of `total` buckets one is kept so that at most `max` are.
pub fn stride(total: i64, max: usize) -> i64 {
    (total.max(0) as u64).div_ceil(max.max(1) as u64).max(1) as i64
}

/// The series `key` from `since` (no `since`: from its first day) to `until`, both included,
/// at most `max` buckets (thinned evenly; the run of a point is looked up only for the points
/// kept): its points for a range of at most [`RAW_MAX_DAYS`] days, whole
/// UTC days of rollups (those `since` and `until` fall in included) for longer ones, and
/// for a short range whose points retention has dropped.
pub async fn range(
    db: &sqlx::PgPool,
    key: &SeriesKey,
    since: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
    max: usize,
) -> Result<Range, sqlx::Error> {
    let from = match since {
        Some(since) => Some(since),
        None => first_day(db, key).await?,
    };
    if let Some(from) = from
        && reads_rollups(from, until)
    {
        let days = rollups(db, key, from.date_naive(), until.date_naive()).await?;
        return Ok(thin(Resolution::Days, days, max));
    }
    struct Row {
        bucket: Bucket,
        total: i64,
    }
    let rows: Vec<Row> = sqlx::query!(
        r#"SELECT s.t AS "t!", 1::int8 AS "n!", s.value AS "mean!", s.value AS "min!",
                s.value AS "max!", s.value AS "median!", s.result_id AS "result_id?",
                v.run_id AS "run_id?", s.total AS "total!"
             FROM (
                 SELECT p.t, p.value, p.result_id,
                        row_number() OVER (ORDER BY p.t DESC, p.result_id DESC) AS newest, count(*) OVER () AS total
                 FROM (SELECT t, value, result_id FROM series_points
                       WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5
                         AND pair = $6 AND ($7::timestamptz IS NULL OR t >= $7) AND t <= $8
                       ORDER BY t DESC, result_id DESC LIMIT $10) p
             ) s
             LEFT JOIN LATERAL (SELECT run_id FROM verdicts v
                                WHERE v.result_id = s.result_id AND v.received_at = s.t) v ON true
             WHERE (s.newest - 1) % greatest(1, ceil(s.total::float8 / $9))::bigint = 0
             ORDER BY s.t, s.result_id"#,
        key.node_id,
        key.test,
        key.metric,
        key.band,
        key.world_size,
        key.pair,
        since,
        until,
        max.max(1) as i64,
        MAX_RAW_POINTS,
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| Row {
        bucket: Bucket {
            t: r.t,
            n: r.n,
            mean: r.mean,
            min: r.min,
            max: r.max,
            median: r.median,
            result_id: r.result_id,
            run_id: r.run_id,
        },
        total: r.total,
    })
    .collect();
    let total = rows.first().map_or(0, |r| r.total);
    if total == 0
        && let Some(from) = from
    {
        // Figures past their retention: the days they were rolled up into remain.
        let days = rollups(db, key, from.date_naive(), until.date_naive()).await?;
        if !days.is_empty() {
            return Ok(thin(Resolution::Days, days, max));
        }
    }
    Ok(Range {
        resolution: Resolution::Points,
        buckets: rows.into_iter().map(|r| r.bucket).collect(),
        total,
        stride: stride(total, max),
    })
}

/// Keeps every `stride`-th of `all` (oldest first) counted back from the newest.
fn thin(resolution: Resolution, all: Vec<Bucket>, max: usize) -> Range {
    let total = all.len() as i64;
    let stride = stride(total, max);
    let last = all.len().saturating_sub(1);
    let buckets = all
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (last - i) as i64 % stride == 0)
        .map(|(_, b)| b)
        .collect();
    Range {
        resolution,
        buckets,
        total,
        stride,
    }
}

/// The first day the series has a rollup of (rollups outlive points, and every point has
/// one), through `series_daily`'s primary key.
async fn first_day(
    db: &sqlx::PgPool,
    key: &SeriesKey,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT (min(day)::timestamp AT TIME ZONE 'UTC') AS "first?" FROM series_daily
         WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6"#,
        key.node_id,
        key.test,
        key.metric,
        key.band,
        key.world_size,
        key.pair,
    )
    .fetch_one(db)
    .await
}

/// Whether the series has a point or a rollup at all, whatever the range.
pub async fn exists(db: &sqlx::PgPool, key: &SeriesKey) -> Result<bool, sqlx::Error> {
    Ok(first_day(db, key).await?.is_some())
}

/// The series' days from `first` to `last` (both included), oldest first.
pub async fn rollups(
    db: &sqlx::PgPool,
    key: &SeriesKey,
    first: NaiveDate,
    last: NaiveDate,
) -> Result<Vec<Bucket>, sqlx::Error> {
    sqlx::query_as!(
        Bucket,
        r#"SELECT (day::timestamp AT TIME ZONE 'UTC') AS "t!", n, sum / n AS "mean!", min, max, median,
                NULL::uuid AS "result_id?", NULL::uuid AS "run_id?"
         FROM series_daily
         WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6
           AND day >= $7 AND day <= $8
         ORDER BY day"#,
        key.node_id,
        key.test,
        key.metric,
        key.band,
        key.world_size,
        key.pair,
        first,
        last,
    )
    .fetch_all(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stride_keeps_at_most_the_bound() {
        assert_eq!(stride(0, 1000), 1);
        assert_eq!(stride(1, 1000), 1);
        assert_eq!(stride(1000, 1000), 1);
        assert_eq!(stride(1001, 1000), 2);
        for total in [999, 1000, 1001, 2999, 3000, 3001, 100_000] {
            let kept = (total as u64).div_ceil(stride(total, 1000) as u64);
            assert!(kept <= 1000, "{total}: {kept}");
        }
    }

    #[test]
    fn thinning_keeps_the_newest_and_every_strideth_before_it() {
        let day = |i: i64| Bucket {
            t: DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::days(i),
            n: 1,
            mean: i as f64,
            min: i as f64,
            max: i as f64,
            median: i as f64,
            result_id: None,
            run_id: None,
        };
        let r = thin(Resolution::Days, (0..1095).map(day).collect(), 1000);
        assert_eq!((r.total, r.stride), (1095, 2));
        assert_eq!(r.buckets.len(), 548);
        assert_eq!(r.buckets.last().unwrap().mean, 1094.0);
        assert_eq!(r.buckets[0].mean, 0.0);
        assert!(r.buckets.windows(2).all(|w| w[1].mean - w[0].mean == 2.0));
        let r = thin(Resolution::Days, (0..365).map(day).collect(), 1000);
        assert_eq!((r.total, r.stride, r.buckets.len()), (365, 1, 365));
        let r = thin(Resolution::Days, Vec::new(), 1000);
        assert_eq!((r.total, r.stride, r.buckets.len()), (0, 1, 0));
    }
}
