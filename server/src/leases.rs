//! Lease expiry. Every replica runs this reaper; it is one UPDATE whose row locks make
//! concurrent runs harmless (a row is requeued by whichever replica gets it first, and the
//! other's WHERE no longer matches it).

use std::time::Duration;

use crate::AppState;

/// Requeues (or fails, after the last attempt) jobs whose lease ran out more than `margin`
/// ago. The margin covers heartbeats that renewed a lease and still wait in a replica's
/// memory for their flush (`liveness.rs`). Returns how many jobs were touched.
pub async fn reap_expired(db: &sqlx::PgPool, margin: Duration) -> Result<u64, sqlx::Error> {
    let rows: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "UPDATE jobs SET
            state = CASE WHEN cancel_requested THEN 'cancelled'
                         WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
            error = CASE WHEN cancel_requested THEN 'cancelled; its agent stopped heartbeating before confirming'
                         WHEN attempts >= max_attempts THEN format('lease expired on attempt %s of %s: the agent stopped heartbeating', attempts, max_attempts)
                         ELSE format('lease expired on attempt %s of %s: the agent stopped heartbeating; requeued', attempts, max_attempts) END,
            finished_at = CASE WHEN cancel_requested OR attempts >= max_attempts THEN now() END,
            lease_agent_id = NULL, lease_expires_at = NULL, progress = NULL
         WHERE state IN ('leased', 'running') AND lease_expires_at < now() - make_interval(secs => $1)
         RETURNING id, state",
    )
    .bind(margin.as_secs_f64())
    .fetch_all(db)
    .await?;
    for (id, state) in &rows {
        tracing::warn!(job = %id, new_state = %state, "lease expired");
    }
    sqlx::query("DELETE FROM rendezvous WHERE created_at < now() - interval '1 day'")
        .execute(db)
        .await?;
    Ok(rows.len() as u64)
}

/// Ticks four times per heartbeat interval, so an expired lease is noticed within a quarter
/// interval of expiring.
pub async fn run_reaper(state: AppState) {
    let mut tick = tokio::time::interval(state.config.heartbeat_interval() / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(err) = reap_expired(&state.db, state.config.lease_margin()).await {
            tracing::warn!(error = %err, "lease reaper: database error; will retry");
        }
    }
}
