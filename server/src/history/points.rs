//! A judged result's series points and their daily rollups, written in its verdict's
//! transaction (`health::verdict::judge_result`): one `series_points` row per figure of a
//! succeeded result, and per series and UTC day one `series_daily` row with the count, sum
//! (the mean is sum / n), min, max, and the median of the day's 64 newest points (kept in
//! `recent`; a nightly fleet has one or a few points a day, so that median is the day's).
//!
//! A first judgement adds its points to the rollups in the same statement (an upsert, O(1)
//! per series whatever the day holds). A result judged again has its points replaced and
//! its node's rollups of the day computed again from the points ([`roll_up_day`]), so a
//! rollup always equals the aggregates of the points it was made from.

use chrono::{DateTime, NaiveDate, Utc};
use uuid::Uuid;

/// A judged result, as its points need it.
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a> {
    pub node_id: Uuid,
    pub result_id: Uuid,
    /// The result's arrival: its points' time.
    pub received_at: DateTime<Utc>,
    pub world_size: i32,
    /// The verdict's figures, `[{test, metric, size_bytes, band, value, pair?}]`.
    pub figures: &'a serde_json::Value,
}

/// The figures of $4 as rows (a figure without a finite value or a band has no point).
const FIGURES: &str =
    "SELECT f->>'test' AS test, f->>'metric' AS metric, (f->>'band')::int AS band,
        coalesce(f->>'pair', '') AS pair, (f->>'value')::float8 AS value
    FROM jsonb_array_elements($4) f
    WHERE jsonb_typeof(f->'value') = 'number' AND jsonb_typeof(f->'band') = 'number'
      AND f->>'test' IS NOT NULL AND f->>'metric' IS NOT NULL";

/// Records the points of a succeeded result's figures and rolls them up.
pub async fn record(conn: &mut sqlx::PgConnection, j: &Judged<'_>) -> Result<(), sqlx::Error> {
    let replaced: Vec<(Uuid, NaiveDate)> = sqlx::query!(
        r#"DELETE FROM series_points WHERE result_id = $1
         RETURNING node_id, (t AT TIME ZONE 'UTC')::date AS "day!""#,
        j.result_id,
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.node_id, r.day))
    .collect();
    if replaced.is_empty() {
        return record_first(conn, j).await;
    }
    // Run time: FIGURES, the rule of which figures have points, is shared with
    // `record_first` (history::rollups_equal_the_aggregates_of_their_points).
    sqlx::query(&format!(
        "INSERT INTO series_points (node_id, test, metric, band, world_size, pair, t, value, result_id)
         SELECT $1, test, metric, band, $3, pair, $2, value, $5 FROM ({FIGURES}) f"
    ))
    .bind(j.node_id)
    .bind(j.received_at)
    .bind(j.world_size)
    .bind(j.figures)
    .bind(j.result_id)
    .execute(&mut *conn)
    .await?;
    let mut days = replaced;
    days.push((j.node_id, j.received_at.date_naive()));
    days.sort();
    days.dedup();
    for (node_id, day) in days {
        roll_up_day(conn, node_id, day).await?;
    }
    Ok(())
}

/// Records the points of a result judged for the first time, in the transaction that
/// stored it (it has no points to replace), and adds them to the rollups: one statement.
pub async fn record_first(
    conn: &mut sqlx::PgConnection,
    j: &Judged<'_>,
) -> Result<(), sqlx::Error> {
    // Run time: FIGURES is shared with `record`
    // (history::rollups_equal_the_aggregates_of_their_points).
    sqlx::query(&format!(
        "WITH p AS (
            INSERT INTO series_points (node_id, test, metric, band, world_size, pair, t, value, result_id)
            SELECT $1, test, metric, band, $3, pair, $2, value, $5 FROM ({FIGURES}) f
            RETURNING test, metric, band, pair, value)
         INSERT INTO series_daily AS d (node_id, test, metric, band, world_size, pair, day, n, sum, min, max, median, recent)
         SELECT $1, test, metric, band, $3, pair, ($2::timestamptz AT TIME ZONE 'UTC')::date, count(*), sum(value),
                min(value), max(value), series_median(series_recent(array_agg(value))), series_recent(array_agg(value))
         FROM p GROUP BY test, metric, band, pair
         ON CONFLICT (node_id, test, metric, band, world_size, pair, day) DO UPDATE SET
             n = d.n + EXCLUDED.n, sum = d.sum + EXCLUDED.sum, min = least(d.min, EXCLUDED.min),
             max = greatest(d.max, EXCLUDED.max), recent = series_recent(d.recent || EXCLUDED.recent),
             median = series_median(series_recent(d.recent || EXCLUDED.recent))"
    ))
    .bind(j.node_id)
    .bind(j.received_at)
    .bind(j.world_size)
    .bind(j.figures)
    .bind(j.result_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Computes a node's rollups of one UTC day again from its points.
pub async fn roll_up_day(
    conn: &mut sqlx::PgConnection,
    node_id: Uuid,
    day: NaiveDate,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM series_daily WHERE node_id = $1 AND day = $2",
        node_id,
        day
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "INSERT INTO series_daily (node_id, test, metric, band, world_size, pair, day, n, sum, min, max, median, recent)
         SELECT node_id, test, metric, band, world_size, pair, $2, count(*), sum(value), min(value), max(value),
                series_median(series_recent(array_agg(value ORDER BY t, result_id))),
                series_recent(array_agg(value ORDER BY t, result_id))
         FROM series_points
         WHERE node_id = $1 AND t >= ($2::date::timestamp AT TIME ZONE 'UTC') AND t < (($2::date + 1)::timestamp AT TIME ZONE 'UTC')
         GROUP BY node_id, test, metric, band, world_size, pair",
        node_id,
        day,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}
