//! A communicator's progress as one rank saw it: how far it got, what it is in now and
//! since when, and when it entered its recent collectives. The profiler plugin writes one
//! per communicator; the server lines up the ranks of a communicator across nodes by it
//! (a hung job's culprit is the rank that never entered the collective its peers wait in;
//! a straggler is the rank that enters last). docs/profiler.md, "Progress".

use serde::{Deserialize, Serialize};

use super::SpoolError;

/// Most recent collectives whose start times a rank reports.
pub const MAX_ARRIVALS: usize = 128;
/// The clock every `*_ns` time of a [`Progress`] is read on.
pub const CLOCK_REALTIME: &str = "realtime";

/// What tells the plugin that an operation finished on this communicator. NCCL's own
/// events for a collective stop once it is handed to the GPU and the proxy, so completion
/// needs another signal; which stalls each can and cannot see is in docs/profiler.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Completion {
    /// None: operations are known started, never complete (a communicator within a node
    /// with kernel channel events sampled only part of the time).
    None,
    /// The communicator's proxy (network) operations: all that were posted have stopped.
    Proxy,
    /// Kernel channel events are on all the time (`HEDDLE_PROFILER_KERNEL=1`): every
    /// operation's last channel stop on the GPU.
    Kernel,
}

/// The oldest operation this rank started on the communicator and does not know complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InFlight {
    /// Its number among this rank's collectives (or point-to-point operations, when `p2p`)
    /// on the communicator, from 1: the same collective has the same number on every rank.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p: bool,
    /// NCCL's own `seqNumber` of the collective (NCCL counts per function).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_seq: Option<u64>,
    pub func: String,
    pub bytes: u64,
    /// When it started, in ns since the Unix epoch on [`Progress::clock`].
    pub started_ns: u64,
}

/// One communicator's progress on this rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Progress {
    /// The clock the times are read on: [`CLOCK_REALTIME`] (the node's wall clock, which
    /// the server corrects by the node's measured offset).
    pub clock: String,
    /// When this was taken, on that clock.
    pub now_ns: u64,
    /// Collectives started on the communicator by this rank, and known complete.
    pub coll_started: u64,
    pub coll_done: u64,
    /// Point-to-point operations started and known complete (ranks differ in these).
    pub p2p_started: u64,
    pub p2p_done: u64,
    /// When its last operation started; 0 before the first.
    pub last_start_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlight>,
    pub completion: Completion,
    /// Proxy operations posted and not yet stopped, and when the last one stopped (0:
    /// none yet).
    #[serde(default)]
    pub proxy_in_flight: u64,
    #[serde(default)]
    pub proxy_last_stop_ns: u64,
    /// The most recent collectives' (seq, start ns), oldest first.
    #[serde(default)]
    pub arrivals: Vec<[u64; 2]>,
}

impl Progress {
    /// The bounds the agent and server hold a rank's progress to.
    pub fn check(&self) -> Result<(), SpoolError> {
        if self.clock != CLOCK_REALTIME {
            return Err(SpoolError(format!(
                "progress on clock {:?}; only {CLOCK_REALTIME:?} is read",
                self.clock.chars().take(32).collect::<String>()
            )));
        }
        if self.arrivals.len() > MAX_ARRIVALS
            || self.coll_done > self.coll_started
            || self.p2p_done > self.p2p_started
            || i64::try_from(self.coll_started.max(self.p2p_started)).is_err()
            || self.arrivals.iter().any(|a| a[0] > self.coll_started)
        {
            return Err(SpoolError("progress out of range".into()));
        }
        if let Some(f) = &self.in_flight {
            super::check_text("func", &f.func)?;
            let started = if f.p2p {
                self.p2p_started
            } else {
                self.coll_started
            };
            if f.seq == 0 || f.seq > started {
                return Err(SpoolError("operation in flight out of range".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn sample() -> Progress {
        Progress {
            clock: CLOCK_REALTIME.into(),
            now_ns: 2_000,
            coll_started: 10,
            coll_done: 9,
            p2p_started: 0,
            p2p_done: 0,
            last_start_ns: 1_000,
            in_flight: Some(InFlight {
                seq: 10,
                p2p: false,
                nccl_seq: Some(4),
                func: "AllReduce".into(),
                bytes: 1 << 20,
                started_ns: 1_000,
            }),
            completion: Completion::Proxy,
            proxy_in_flight: 2,
            proxy_last_stop_ns: 900,
            arrivals: vec![[9, 500], [10, 1_000]],
        }
    }

    #[test]
    fn bounds() {
        assert!(sample().check().is_ok());
        let mut p = sample();
        p.coll_done = 11;
        assert!(p.check().is_err());
        let mut p = sample();
        p.arrivals = vec![[1, 1]; MAX_ARRIVALS + 1];
        assert!(p.check().is_err());
        let mut p = sample();
        p.in_flight.as_mut().unwrap().seq = 11;
        assert!(p.check().is_err());
        let mut p = sample();
        p.clock = "monotonic".into();
        assert!(p.check().is_err());
        let mut p = sample();
        p.in_flight.as_mut().unwrap().func = "x\u{7}".into();
        assert!(p.check().is_err());
        let json = serde_json::to_string(&sample()).unwrap();
        assert_eq!(serde_json::from_str::<Progress>(&json).unwrap(), sample());
    }
}
