//! Lease expiry. Every replica runs the reaper (`workers/lease_reaper.rs`); each tick is one
//! transaction (its job changes are `jobs::store`'s `Move::Expire` and `Move::Heartbeat` on
//! the clock's behalf) whose row locks make concurrent runs harmless (the lease clock's row serialises the ticks, and a
//! job is requeued by whichever replica gets it first: the other's WHERE no longer
//! matches it).
//!
//! Leases are judged only on time in which the database could be written. Each tick first
//! advances the lease clock (`lease_clock.ticked_at`); a tick that finds the clock further
//! behind than [`allowance`] knows that no replica could judge leases for that long
//! (Postgres was down or restarting, or every replica was), so the leases granted before
//! that gap start a fresh term of one lease plus the allowance, counted from the moment
//! the database is back, before anything is judged. An outage of any length therefore
//! requeues nothing and stops no child: agents keep running, and their renewals resume
//! within a heartbeat of the return.

use std::time::Duration;

use crate::jobs::JobError;

/// How far behind the lease clock may fall between two ticks before the gap counts as time
/// in which nobody could judge leases: two tick periods, so one slow or skipped tick of a
/// healthy replica is no gap.
pub fn allowance(heartbeat: Duration) -> Duration {
    tick_period(heartbeat) * 2
}

/// Four ticks per heartbeat interval, so an expired lease is noticed within a quarter
/// interval of expiring.
pub fn tick_period(heartbeat: Duration) -> Duration {
    heartbeat / 4
}

/// What a tick of the lease clock found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockTick {
    /// Time since the previous tick of any replica.
    pub gap: Duration,
    /// Leases given a fresh term because the gap exceeded the allowance.
    pub extended: u64,
}

/// Advances the lease clock inside `conn`'s transaction. When the previous tick lies more
/// than `allowance` back, every lease granted before it (one that expires earlier than the
/// previous tick plus `lease_ttl` plus `allowance`; a renewal after the gap lies later)
/// gets `lease_ttl + allowance` from now. A lease renewed after the gap already has a full
/// term and is left alone.
pub async fn advance_clock(
    conn: &mut sqlx::PgConnection,
    allowance: Duration,
    lease_ttl: Duration,
) -> Result<ClockTick, JobError> {
    // clock_timestamp(), not now(): a tick that waited for another replica's lock must see
    // that replica's tick as recent, and must not move the clock backwards.
    let row = sqlx::query!(
        r#"WITH prev AS (SELECT ticked_at FROM lease_clock WHERE id FOR UPDATE)
         UPDATE lease_clock SET ticked_at = greatest(prev.ticked_at, clock_timestamp())
         FROM prev WHERE lease_clock.id
         RETURNING extract(epoch FROM clock_timestamp() - prev.ticked_at)::float8 AS "gap_s!",
                   prev.ticked_at AS "previous!""#,
    )
    .fetch_one(&mut *conn)
    .await?;
    let (gap_s, previous) = (row.gap_s, row.previous);
    let gap = Duration::try_from_secs_f64(gap_s.max(0.0)).unwrap_or_default();
    if gap <= allowance {
        return Ok(ClockTick { gap, extended: 0 });
    }
    let extended =
        crate::jobs::store::extend_leases_after_gap(&mut *conn, previous, lease_ttl + allowance)
            .await?;
    tracing::warn!(
        gap = ?gap,
        extended,
        "no replica could reach the database for longer than a lease tick; the leases from \
         before are not judged on that time and start a fresh term"
    );
    Ok(ClockTick { gap, extended })
}

/// Requeues (or fails, after the last attempt) jobs whose lease ran out more than `margin`
/// ago. The margin covers heartbeats that renewed a lease and still wait in a replica's
/// memory for their flush (`liveness.rs`). Returns how many jobs were touched.
pub async fn reap_expired(
    conn: &mut sqlx::PgConnection,
    margin: Duration,
) -> Result<u64, JobError> {
    let rows = crate::jobs::store::expire_leases(&mut *conn, margin).await?;
    for (id, state) in &rows {
        tracing::warn!(job = %id, new_state = %state, "lease expired");
    }
    sqlx::query!("DELETE FROM rendezvous WHERE created_at < now() - interval '1 day'")
        .execute(&mut *conn)
        .await?;
    Ok(rows.len() as u64)
}

/// One tick: the lease clock, then expiry, in one transaction, so leases are never judged
/// by a tick that did not first account for a gap (e.g. one that stalled across an
/// outage: its commit fails and it judged nothing).
pub async fn tick(
    db: &sqlx::PgPool,
    heartbeat: Duration,
    lease_ttl: Duration,
    margin: Duration,
) -> Result<(ClockTick, u64), JobError> {
    let mut tx = db.begin().await?;
    let clock = advance_clock(&mut tx, allowance(heartbeat), lease_ttl).await?;
    let reaped = reap_expired(&mut tx, margin).await?;
    tx.commit().await?;
    Ok((clock, reaped))
}
