//! A job's life as a table: which move may take a job from which state to which. Pure, so
//! the rules are read and tested without a database; `store.rs` checks every row it moves
//! against [`Move::check`].
//!
//! ```text
//!   queued ──claim──▶ leased ──renew──▶ running
//!     ▲                  │                 │
//!     └──expire (attempts left)────────────┤
//!                        │                 │
//!   finish (the claim's result): ─────────▶ succeeded | failed | skipped | cancelled
//!   expire (last attempt / cancel asked): ▶ failed | cancelled
//!   cancel, give up (nobody claimed it): queued ▶ cancelled
//! ```

use heddle_types::jobs::JobState::{self, *};

/// Who or what moves a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// An agent claims the oldest queued job of its node.
    Claim,
    /// The claimant renews its lease; the first renewal marks the job running.
    Renew,
    /// A heartbeat extends the leases of the agent's claimed jobs; the state stays.
    Heartbeat,
    /// The result of the job's latest claim ends it. Accepted whatever became of the lease
    /// (a requeued job, or one failed after its last attempt, still takes its claim's
    /// result); a job cancelled meanwhile stays cancelled.
    Finish,
    /// The lease reaper: an expired lease requeues the job, fails it after its last
    /// attempt, or cancels it when a cancel was asked for.
    Expire,
    /// An agent's credential is revoked or replaced: its leases end now, so the reaper
    /// moves its jobs on its next tick. The state stays.
    EndLease,
    /// A person cancels a run: queued jobs end; claimed ones are asked to stop (their
    /// state stays until their agent's result or the reaper).
    Cancel,
    /// An investigation gives up on a pair whose job nobody claimed in time: that job and
    /// its queued peers end; claimed peers are asked to stop.
    GiveUp,
    /// An investigation orders a new batch after earlier ones in the claim order; only
    /// queued jobs, and the state stays.
    Reorder,
}

const CLAIMED: &[JobState] = &[Leased, Running];
/// States a job can be in when its claim's result arrives: not one that has a result.
const AWAITING_RESULT: &[JobState] = &[Queued, Leased, Running, Failed, Cancelled];

impl Move {
    /// The states this move may take a job from.
    pub fn sources(self) -> &'static [JobState] {
        match self {
            Move::Claim | Move::Cancel | Move::GiveUp | Move::Reorder => &[Queued],
            Move::Renew | Move::Heartbeat | Move::Expire | Move::EndLease => CLAIMED,
            Move::Finish => AWAITING_RESULT,
        }
    }

    /// The states this move may leave a job in.
    pub fn targets(self) -> &'static [JobState] {
        match self {
            Move::Claim => &[Leased],
            Move::Renew => &[Running],
            Move::Heartbeat | Move::EndLease => CLAIMED,
            Move::Finish => &[Succeeded, Failed, Skipped, Cancelled],
            Move::Expire => &[Queued, Failed, Cancelled],
            Move::Cancel | Move::GiveUp => &[Cancelled],
            Move::Reorder => &[Queued],
        }
    }

    /// Whether this move may take a job from `from` to `to`; moves that keep the state
    /// (heartbeats, ended leases, reordering) must keep it.
    pub fn check(self, from: JobState, to: JobState) -> Result<(), IllegalMove> {
        let keeps_state = matches!(self, Move::Heartbeat | Move::EndLease | Move::Reorder);
        let ok = self.sources().contains(&from)
            && self.targets().contains(&to)
            && (!keeps_state || from == to)
            && match self {
                // A job cancelled meanwhile stays cancelled, whatever its result says.
                Move::Finish => from != Cancelled || to == Cancelled,
                _ => true,
            };
        if ok {
            Ok(())
        } else {
            Err(IllegalMove { by: self, from, to })
        }
    }
}

/// The state a job ends in when its claim's result says `outcome`.
pub fn finish_state(current: JobState, outcome: JobState) -> Result<JobState, IllegalMove> {
    let to = if current == Cancelled {
        Cancelled
    } else {
        outcome
    };
    Move::Finish.check(current, to)?;
    Ok(to)
}

/// A move the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a job may not move from {from} to {to} by {by:?}")]
pub struct IllegalMove {
    pub by: Move,
    pub from: JobState,
    pub to: JobState,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOVES: [Move; 9] = [
        Move::Claim,
        Move::Renew,
        Move::Heartbeat,
        Move::Finish,
        Move::Expire,
        Move::EndLease,
        Move::Cancel,
        Move::GiveUp,
        Move::Reorder,
    ];

    #[test]
    fn the_life_of_a_job() {
        assert!(Move::Claim.check(Queued, Leased).is_ok());
        assert!(Move::Renew.check(Leased, Running).is_ok());
        assert!(Move::Renew.check(Running, Running).is_ok());
        assert!(Move::Finish.check(Running, Succeeded).is_ok());
        assert!(Move::Expire.check(Running, Queued).is_ok());
        assert!(Move::Expire.check(Leased, Failed).is_ok());
        assert!(Move::Cancel.check(Queued, Cancelled).is_ok());
        assert!(Move::GiveUp.check(Queued, Cancelled).is_ok());
    }

    #[test]
    fn illegal_moves_are_refused() {
        // Claiming is for queued jobs only.
        assert!(Move::Claim.check(Running, Leased).is_err());
        assert!(Move::Claim.check(Cancelled, Leased).is_err());
        // A renewal never revives an ended job.
        assert!(Move::Renew.check(Queued, Running).is_err());
        assert!(Move::Renew.check(Failed, Running).is_err());
        // Moves that keep the state keep it.
        assert!(Move::Heartbeat.check(Leased, Running).is_err());
        assert!(Move::EndLease.check(Running, Queued).is_err());
        assert!(Move::Reorder.check(Queued, Leased).is_err());
        // The reaper only touches claimed jobs and never finishes one as succeeded.
        assert!(Move::Expire.check(Queued, Failed).is_err());
        assert!(Move::Expire.check(Running, Succeeded).is_err());
        // Cancelling ends queued jobs only: claimed ones are asked, not moved.
        assert!(Move::Cancel.check(Running, Cancelled).is_err());
        let err = Move::Cancel.check(Succeeded, Cancelled).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a job may not move from succeeded to cancelled by Cancel"
        );
    }

    #[test]
    fn a_result_ends_a_job_once() {
        assert_eq!(finish_state(Running, Succeeded), Ok(Succeeded));
        assert_eq!(finish_state(Leased, Skipped), Ok(Skipped));
        // The claim's result still lands after a requeue or the last attempt's expiry.
        assert_eq!(finish_state(Queued, Succeeded), Ok(Succeeded));
        assert_eq!(finish_state(Failed, Succeeded), Ok(Succeeded));
        // Cancelled meanwhile: stays cancelled.
        assert_eq!(finish_state(Cancelled, Succeeded), Ok(Cancelled));
        // A job with a result takes no second one.
        assert!(finish_state(Succeeded, Failed).is_err());
        assert!(finish_state(Skipped, Succeeded).is_err());
        assert!(Move::Finish.check(Cancelled, Succeeded).is_err());
    }

    #[test]
    fn every_target_is_reachable_from_some_source() {
        for m in MOVES {
            for to in m.targets() {
                assert!(
                    m.sources().iter().any(|from| m.check(*from, *to).is_ok()),
                    "{m:?} lists {to} but never reaches it"
                );
            }
            for from in JobState::ALL {
                if !m.sources().contains(&from) {
                    assert!(JobState::ALL.iter().all(|to| m.check(from, *to).is_err()));
                }
            }
        }
    }
}
