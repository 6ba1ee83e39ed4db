//! Retention: whole months of history are dropped once they have expired, never deleted row
//! by row. A month of `results`, `result_rows`, `verdicts` and `series_points` goes when its
//! last day is `HEDDLE_HISTORY_KEEP_DAYS` old (so rows live that long and up to a month
//! more), a month of `series_daily` when its last day is `HEDDLE_ROLLUP_KEEP_DAYS` old.
//!
//! A partition is detached with `DETACH PARTITION ... CONCURRENTLY` (which does not block
//! uploads or reads of the table; a detach that was interrupted is finished with
//! `FINALIZE`), then dropped. What must outlive its month does not live in one:
//! `latest_verdicts` keeps each node's latest verdict per test, `change_points` keeps
//! changes (and the detector rewrites only those inside the points it reads), and the
//! rollups keep the series' daily levels.

use std::time::Instant;

use sqlx::Executor;

use super::{Keep, partitions};

/// The rollups' table; every other history table holds full rows.
const ROLLUPS: &str = "series_daily";

/// A partition that was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub table: String,
    pub partition: String,
}

/// Drops every expired partition (a replica that finds another one at it does nothing).
/// Returns what it dropped, oldest month first per table.
pub async fn sweep(db: &sqlx::PgPool, keep: Keep) -> Result<Vec<Dropped>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_lock($1, $2) AS "locked!""#,
        partitions::LOCK.0,
        partitions::LOCK.1,
    )
    .fetch_one(&mut *conn)
    .await?;
    if !locked {
        return Ok(Vec::new());
    }
    let swept = sweep_locked(&mut conn, keep).await;
    let unlocked = sqlx::query_scalar!(
        r#"SELECT pg_advisory_unlock($1, $2) AS "unlocked?""#,
        partitions::LOCK.0,
        partitions::LOCK.1,
    )
    .fetch_one(&mut *conn)
    .await;
    if unlocked.is_err() {
        // The lock is the session's: a connection that may still hold it must not go back
        // to the pool.
        conn.close_on_drop();
    }
    let dropped = swept?;
    unlocked?;
    Ok(dropped)
}

async fn sweep_locked(
    conn: &mut sqlx::PgConnection,
    keep: Keep,
) -> Result<Vec<Dropped>, sqlx::Error> {
    let tables = sqlx::query_scalar!(r#"SELECT unnest(history_tables()) AS "table!""#)
        .fetch_all(&mut *conn)
        .await?;
    let mut dropped = Vec::new();
    for table in tables {
        let days = if table == ROLLUPS {
            keep.rollup_days
        } else {
            keep.raw_days
        };
        if days == 0 {
            continue;
        }
        // Run time: sqlx cannot describe it (its EXPLAIN runs the function with NULL, which fails)
        // (history::retention_drops_an_expired_month_and_keeps_the_latest_verdict_and_open_regression).
        let expired: Vec<(String, bool, bool)> = sqlx::query_as(
            "SELECT name, attached, detach_pending FROM history_expired_partitions($1, current_date - $2)",
        )
        .bind(table.clone())
        .bind(i32::try_from(days).unwrap_or(i32::MAX).min(36_500))
        .fetch_all(&mut *conn)
        .await?;
        for (partition, attached, pending) in expired {
            let started = Instant::now();
            drop_partition(
                &mut *conn,
                table.clone(),
                partition.clone(),
                attached,
                pending,
            )
            .await?;
            tracing::info!(
                table,
                partition,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "history: dropped an expired month"
            );
            dropped.push(Dropped {
                table: table.clone(),
                partition,
            });
        }
    }
    Ok(dropped)
}

/// Detaches (unless it already is) and drops one partition. Names come from
/// `history_expired_partitions`, which matches `<table>_pYYYYMM` only.
async fn drop_partition(
    conn: &mut sqlx::PgConnection,
    table: String,
    partition: String,
    attached: bool,
    pending: bool,
) -> Result<(), sqlx::Error> {
    // Run time: DDL on a partition named at run time
    // (history::retention_drops_an_expired_month_and_keeps_the_latest_verdict_and_open_regression).
    if attached {
        // Outside a transaction (CONCURRENTLY refuses one), as a simple query.
        let how = if pending { "FINALIZE" } else { "CONCURRENTLY" };
        let detach = format!("ALTER TABLE \"{table}\" DETACH PARTITION \"{partition}\" {how}");
        conn.execute(detach.as_str()).await?;
    }
    let drop = format!("DROP TABLE IF EXISTS \"{partition}\"");
    conn.execute(drop.as_str()).await?;
    Ok(())
}
