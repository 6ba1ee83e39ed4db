//! Monthly partitions, created ahead so that an insert always finds its month: from the
//! month the raw retention reaches back to (rows moved back in time within it still land)
//! to [`MONTHS_AHEAD`] months after the current one. The server does it once before serving
//! (`state::connect`) and then on every maintenance tick (`workers/history.rs`), so a
//! missing month would need every replica to be down or failing for three months. There is
//! no DEFAULT partition: a row for a month without one fails its insert (its upload is
//! answered 500 and retried by the agent) rather than landing where retention cannot drop
//! it. The naming and bounds are the SQL function `history_ensure_partitions`
//! (migrations/20261128120000_history_partitions.sql).

use super::Keep;

/// Months created ahead of the current one.
pub const MONTHS_AHEAD: i32 = 3;

/// Advisory lock (class, key) held while partitions are created or dropped, so replicas take
/// turns; distinct from the server's other advisory locks (727274 to 727277).
pub(crate) const LOCK: (i32, i32) = (727_278, 1);

/// Creates the missing monthly partitions of every history table. Returns how many were
/// created (each table's month counts once). Waits at most 5 s for the tables' locks: a
/// partition is created with a short exclusive lock on its parent.
pub async fn ensure(db: &sqlx::PgPool, keep: Keep) -> Result<i32, sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query!("SET LOCAL lock_timeout = '5s'")
        .execute(&mut *tx)
        .await?;
    sqlx::query_scalar!(
        r#"SELECT pg_advisory_xact_lock($1, $2)::text AS "locked?""#,
        LOCK.0,
        LOCK.1,
    )
    .fetch_one(&mut *tx)
    .await?;
    let made = ensure_in(&mut tx, keep).await?;
    tx.commit().await?;
    if made > 0 {
        tracing::info!(
            created = made,
            months_ahead = MONTHS_AHEAD,
            "history: created monthly partitions"
        );
    }
    Ok(made)
}

/// [`ensure`] on a connection the caller holds (and locks as it sees fit).
pub async fn ensure_in(conn: &mut sqlx::PgConnection, keep: Keep) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT history_ensure_partitions(current_date - $1::int, (current_date + make_interval(months => $2))::date)
             AS "made!""#,
        i32::try_from(keep.raw_days).unwrap_or(i32::MAX).min(36_500),
        MONTHS_AHEAD,
    )
    .fetch_one(conn)
    .await
}

/// The months (first days) that have a partition of `table`, oldest first.
pub async fn months(db: &sqlx::PgPool, table: &str) -> Result<Vec<chrono::NaiveDate>, sqlx::Error> {
    let names = sqlx::query_scalar!(
        r#"SELECT c.relname::text AS "name!" FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = to_regclass($1) ORDER BY 1"#,
        table,
    )
    .fetch_all(db)
    .await?;
    Ok(names
        .iter()
        .filter_map(|n| {
            let month = n.strip_prefix(table)?.strip_prefix("_p")?;
            chrono::NaiveDate::parse_from_str(&format!("{month}01"), "%Y%m%d").ok()
        })
        .collect())
}
