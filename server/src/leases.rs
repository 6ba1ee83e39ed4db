//! Lease expiry. Every replica runs this reaper; it is one UPDATE (`jobs::store`'s
//! `Move::Expire`) whose row locks make concurrent runs harmless (a row is requeued by
//! whichever replica gets it first, and the other's WHERE no longer matches it).

use crate::AppState;
use crate::jobs::JobError;

/// Requeues (or fails, after the last attempt) jobs whose lease ran out. Returns how many
/// jobs were touched.
pub async fn reap_expired(db: &sqlx::PgPool) -> Result<u64, JobError> {
    let rows = crate::jobs::store::expire_leases(&mut *db.acquire().await?).await?;
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
        if let Err(err) = reap_expired(&state.db).await {
            tracing::warn!(error = %err, "lease reaper failed; will retry");
        }
    }
}
