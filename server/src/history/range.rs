//! A series over a time range, for charts: its points when the range is at most
//! [`RAW_MAX_DAYS`] long, its daily rollups when longer (a year of a nightly series is 365
//! rows of `series_daily` read through its primary key, whatever the fleet's size).

use chrono::{DateTime, Duration, NaiveDate, Utc};
use uuid::Uuid;

use super::SeriesKey;

/// Ranges longer than this many days are read from the daily rollups.
pub const RAW_MAX_DAYS: i64 = 30;

/// At most this many points are answered for a raw range (its newest).
pub const MAX_RAW_POINTS: i64 = 10_000;

/// A point of the series (`n` = 1, every level its value, `result_id` set) or a day of it
/// (`t` is the day's 00:00 UTC).
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Bucket {
    pub t: DateTime<Utc>,
    pub n: i64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// The day's median (of its 64 newest points), or the point's value.
    pub median: f64,
    pub result_id: Option<Uuid>,
}

/// Whether a range of `since..until` is read from the rollups.
pub fn reads_rollups(since: DateTime<Utc>, until: DateTime<Utc>) -> bool {
    until - since > Duration::days(RAW_MAX_DAYS)
}

/// The series `key` from `since` (inclusive) to `until` (exclusive), oldest first: raw points
/// for short ranges, whole UTC days of rollups (those `since` and `until` fall in included)
/// for long ones.
pub async fn range(
    db: &sqlx::PgPool,
    key: &SeriesKey,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<Bucket>, sqlx::Error> {
    if reads_rollups(since, until) {
        return rollups(db, key, since.date_naive(), until.date_naive()).await;
    }
    let mut points: Vec<Bucket> = key.bind(sqlx::query_as(
        "SELECT t, 1::int8 AS n, value AS mean, value AS min, value AS max, value AS median, result_id
         FROM series_points
         WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6
           AND t >= $7 AND t < $8
         ORDER BY t DESC, result_id DESC LIMIT $9",
    ))
    .bind(since)
    .bind(until)
    .bind(MAX_RAW_POINTS)
    .fetch_all(db)
    .await?;
    points.reverse();
    Ok(points)
}

/// The series' days from `first` to `last` (both included), oldest first.
pub async fn rollups(
    db: &sqlx::PgPool,
    key: &SeriesKey,
    first: NaiveDate,
    last: NaiveDate,
) -> Result<Vec<Bucket>, sqlx::Error> {
    key.bind(sqlx::query_as(
        "SELECT (day::timestamp AT TIME ZONE 'UTC') AS t, n, sum / n AS mean, min, max, median, NULL::uuid AS result_id
         FROM series_daily
         WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6
           AND day >= $7 AND day <= $8
         ORDER BY day",
    ))
    .bind(first)
    .bind(last)
    .fetch_all(db)
    .await
}
