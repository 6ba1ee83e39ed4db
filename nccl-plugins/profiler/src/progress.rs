//! How far a communicator got on this rank: operations started and known complete, a ring
//! of the most recent ones (what, how large, when), and its proxy operations in flight.
//! Written on the event path with atomics only (the ring is allocated with the
//! communicator); read by the writer, which also decides from the proxy counters whether
//! everything started is complete (`heddle_types::observe::Progress`).
//!
//! NCCL runs a communicator's operations in order on the GPU, so "known complete" is a
//! count: the operations before it are complete too.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

use heddle_types::observe::progress::{CLOCK_REALTIME, MAX_ARRIVALS};
use heddle_types::observe::{Completion, InFlight, Progress};

use crate::names::FUNCS;

/// Operations remembered per communicator (a power of two).
pub const RING: usize = 256;
/// `Entry::nccl_seq` when the event carried none.
const NO_SEQ: u64 = u64::MAX;

/// One started operation. `op` is its index + 1, stored last (and cleared first) so that
/// the writer can tell a whole entry from one being overwritten.
#[derive(Default)]
struct Entry {
    op: AtomicU64,
    /// Collectives and point-to-point operations started up to and including this one.
    colls: AtomicU64,
    p2ps: AtomicU64,
    nccl_seq: AtomicU64,
    /// Function id (`names::FUNCS`), high bit set for point-to-point.
    what: AtomicU32,
    bytes: AtomicU64,
    /// CLOCK_MONOTONIC ns.
    start_ns: AtomicU64,
    /// Its proxy operations started and not yet stopped.
    proxy_pending: AtomicU32,
}

/// A copy of an entry the writer read whole.
struct Seen {
    colls: u64,
    p2ps: u64,
    nccl_seq: u64,
    what: u32,
    bytes: u64,
    start_ns: u64,
}

const P2P_BIT: u32 = 1 << 31;

pub struct Tracker {
    /// Operations started; the next one's index.
    ops: AtomicU64,
    colls: AtomicU64,
    p2ps: AtomicU64,
    /// Operations known complete.
    done: AtomicU64,
    last_start_ns: AtomicU64,
    proxy_started: AtomicU64,
    proxy_stopped: AtomicU64,
    proxy_last_stop_ns: AtomicU64,
    ring: Box<[Entry]>,
    /// The start (monotonic ns) of the stall the writer last wrote promptly for.
    reported_stall: AtomicU64,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            ops: AtomicU64::new(0),
            colls: AtomicU64::new(0),
            p2ps: AtomicU64::new(0),
            done: AtomicU64::new(0),
            last_start_ns: AtomicU64::new(0),
            proxy_started: AtomicU64::new(0),
            proxy_stopped: AtomicU64::new(0),
            proxy_last_stop_ns: AtomicU64::new(0),
            ring: (0..RING).map(|_| Entry::default()).collect(),
            reported_stall: AtomicU64::new(0),
        }
    }
}

impl Tracker {
    /// An operation started (event path): its index among the communicator's operations.
    pub fn start(&self, p2p: bool, func: u8, bytes: u64, nccl_seq: Option<u64>, now: u64) -> u64 {
        let op = self.ops.fetch_add(1, Relaxed);
        let (colls, p2ps) = if p2p {
            (
                self.colls.load(Relaxed),
                self.p2ps.fetch_add(1, Relaxed) + 1,
            )
        } else {
            (
                self.colls.fetch_add(1, Relaxed) + 1,
                self.p2ps.load(Relaxed),
            )
        };
        let e = &self.ring[op as usize % RING];
        e.op.store(0, Release);
        e.colls.store(colls, Relaxed);
        e.p2ps.store(p2ps, Relaxed);
        e.nccl_seq.store(nccl_seq.unwrap_or(NO_SEQ), Relaxed);
        e.what
            .store(func as u32 | if p2p { P2P_BIT } else { 0 }, Relaxed);
        e.bytes.store(bytes, Relaxed);
        e.start_ns.store(now, Relaxed);
        e.proxy_pending.store(0, Relaxed);
        e.op.store(op + 1, Release);
        self.last_start_ns.store(now, Release);
        op
    }

    /// Operation `op` finished on the GPU (its last kernel channel stopped): it and every
    /// one before it are complete.
    pub fn completed(&self, op: u64) {
        self.done.fetch_max(op + 1, Relaxed);
    }

    /// The full index of an operation known by its low 32 bits (a slot keeps those).
    pub fn op_of(&self, low: u32) -> u64 {
        let ops = self.ops.load(Relaxed);
        ops.wrapping_sub(u64::from((ops as u32).wrapping_sub(low)))
    }

    /// The entry of operation `op`, while the ring still holds it.
    fn entry(&self, op: u64) -> Option<&Entry> {
        let e = &self.ring[op as usize % RING];
        (e.op.load(Acquire) == op + 1).then_some(e)
    }

    /// A proxy (network) operation of operation `op` (when known) started.
    pub fn proxy_started(&self, op: Option<u64>) {
        self.proxy_started.fetch_add(1, Relaxed);
        if let Some(e) = op.and_then(|op| self.entry(op)) {
            e.proxy_pending.fetch_add(1, Relaxed);
        }
    }

    /// A proxy operation of `op` stopped: when it was the operation's last, the operation
    /// is complete. NCCL's proxy thread starts every channel's proxy operation of one
    /// operation in one pass of its progress loop, before any of them can finish.
    pub fn proxy_stopped(&self, op: Option<u64>, now: u64) {
        self.proxy_last_stop_ns.fetch_max(now, Relaxed);
        self.proxy_stopped.fetch_add(1, Release);
        if let Some(op) = op
            && let Some(e) = self.entry(op)
            && e.proxy_pending
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                == Ok(1)
        {
            self.completed(op);
        }
    }

    fn read(&self, op: u64) -> Option<Seen> {
        let e = &self.ring[op as usize % RING];
        if e.op.load(Acquire) != op + 1 {
            return None;
        }
        let seen = Seen {
            colls: e.colls.load(Relaxed),
            p2ps: e.p2ps.load(Relaxed),
            nccl_seq: e.nccl_seq.load(Relaxed),
            what: e.what.load(Relaxed),
            bytes: e.bytes.load(Relaxed),
            start_ns: e.start_ns.load(Relaxed),
        };
        std::sync::atomic::fence(Acquire);
        (e.op.load(Relaxed) == op + 1).then_some(seen)
    }

    /// What tells completion here: kernel channel events when they are always on, else
    /// proxy operations once any came.
    fn completion(&self, kernel_always: bool) -> Completion {
        if kernel_always {
            Completion::Kernel
        } else if self.proxy_started.load(Relaxed) > 0 {
            Completion::Proxy
        } else {
            Completion::None
        }
    }

    /// Operations started, and known complete.
    fn done_now(&self) -> (u64, u64) {
        let ops = self.ops.load(Acquire);
        (ops, self.done.load(Relaxed).min(ops))
    }

    /// The start (monotonic ns) of what looks stalled for longer than `limit_ns` and was
    /// not yet written promptly, marking it written: the oldest operation not known
    /// complete, or without a completion signal the last operation started.
    pub fn unreported_stall(&self, now: u64, limit_ns: u64, kernel_always: bool) -> Option<u64> {
        let completion = self.completion(kernel_always);
        let (ops, done) = self.done_now();
        if ops == done {
            return None;
        }
        let since = match completion {
            Completion::None => self.last_start_ns.load(Acquire),
            _ => self
                .read(done.max(ops.saturating_sub(RING as u64)))
                .map_or_else(|| self.last_start_ns.load(Acquire), |s| s.start_ns),
        };
        if now.saturating_sub(since) < limit_ns || self.reported_stall.swap(since, Relaxed) == since
        {
            return None;
        }
        Some(since)
    }

    /// The progress as the spool file says it; `to_real` turns a monotonic time into ns
    /// since the Unix epoch.
    pub fn progress(
        &self,
        kernel_always: bool,
        now_real: u64,
        to_real: impl Fn(u64) -> u64,
    ) -> Progress {
        let completion = self.completion(kernel_always);
        let (ops, done) = self.done_now();
        let (colls, p2ps) = (self.colls.load(Relaxed), self.p2ps.load(Relaxed));
        let (coll_done, p2p_done) = if done == ops {
            (colls, p2ps)
        } else {
            match done.checked_sub(1).map(|d| self.read(d)) {
                None => (0, 0),
                Some(Some(s)) => (s.colls, s.p2ps),
                // Overwritten: at least this many.
                Some(None) => (
                    colls.saturating_sub(ops - done),
                    p2ps.saturating_sub(ops - done),
                ),
            }
        };
        let pending = match completion {
            Completion::None => ops.checked_sub(1),
            _ => (done < ops).then(|| done.max(ops.saturating_sub(RING as u64))),
        };
        let in_flight = pending.and_then(|op| self.read(op)).map(|s| {
            let p2p = s.what & P2P_BIT != 0;
            InFlight {
                seq: if p2p { s.p2ps } else { s.colls },
                p2p,
                nccl_seq: (s.nccl_seq != NO_SEQ).then_some(s.nccl_seq),
                func: FUNCS
                    .get((s.what & !P2P_BIT) as usize)
                    .copied()
                    .unwrap_or("Other")
                    .to_string(),
                bytes: s.bytes,
                started_ns: to_real(s.start_ns),
            }
        });
        let mut arrivals: Vec<[u64; 2]> = Vec::with_capacity(MAX_ARRIVALS);
        for op in (ops.saturating_sub(RING as u64)..ops).rev() {
            if arrivals.len() == MAX_ARRIVALS {
                break;
            }
            if let Some(s) = self.read(op)
                && s.what & P2P_BIT == 0
            {
                arrivals.push([s.colls, to_real(s.start_ns)]);
            }
        }
        arrivals.reverse();
        // The counters may have moved on since the entries were read.
        let coll_started = colls.max(arrivals.last().map_or(0, |a| a[0]));
        let last_start = self.last_start_ns.load(Acquire);
        let proxy_stopped = self.proxy_stopped.load(Acquire);
        let proxy_last = self.proxy_last_stop_ns.load(Relaxed);
        Progress {
            clock: CLOCK_REALTIME.into(),
            now_ns: now_real,
            coll_started,
            coll_done: coll_done.min(coll_started),
            p2p_started: p2ps,
            p2p_done: p2p_done.min(p2ps),
            last_start_ns: if last_start == 0 {
                0
            } else {
                to_real(last_start)
            },
            in_flight,
            completion,
            proxy_in_flight: self
                .proxy_started
                .load(Relaxed)
                .saturating_sub(proxy_stopped),
            proxy_last_stop_ns: if proxy_last == 0 {
                0
            } else {
                to_real(proxy_last)
            },
            arrivals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AR: u8 = 1;

    #[test]
    fn started_complete_and_in_flight() {
        let t = Tracker::default();
        let p = t.progress(false, 0, |x| x);
        assert_eq!(
            (p.coll_started, p.in_flight, p.completion),
            (0, None, Completion::None)
        );
        for i in 0..3 {
            t.start(false, AR, 8, Some(i), 100 + i);
        }
        t.start(true, 9, 4, None, 200);
        // No completion signal: the last started is what it may be in.
        let p = t.progress(false, 1_000, |x| x + 10);
        assert_eq!((p.coll_started, p.coll_done, p.p2p_started), (3, 0, 1));
        let f = p.in_flight.unwrap();
        assert_eq!((f.seq, f.p2p, f.started_ns), (1, true, 210));
        assert_eq!(p.arrivals, vec![[1, 110], [2, 111], [3, 112]]);
        // The GPU finished the second: the third is the oldest in flight.
        t.completed(t.op_of(1));
        t.proxy_started(Some(2));
        t.proxy_started(Some(2));
        t.proxy_started(Some(3));
        let p = t.progress(false, 0, |x| x);
        assert_eq!(
            (p.completion, p.coll_done, p.p2p_done),
            (Completion::Proxy, 2, 0)
        );
        let f = p.in_flight.unwrap();
        assert_eq!(
            (f.seq, f.p2p, f.nccl_seq, f.func.as_str()),
            (3, false, Some(2), FUNCS[1])
        );
        assert_eq!(p.proxy_in_flight, 3);
        // One of the third's two proxy operations stopped: still in flight.
        t.proxy_stopped(Some(2), 300);
        assert_eq!(t.progress(false, 0, |x| x).coll_done, 2);
        // An unknown one changes nothing; the last of the p2p's completes everything.
        t.proxy_stopped(None, 300);
        t.proxy_stopped(Some(3), 310);
        let p = t.progress(false, 0, |x| x);
        assert_eq!((p.coll_done, p.p2p_done, p.in_flight), (3, 1, None));
        assert_eq!(p.proxy_in_flight, 0);
    }

    #[test]
    fn a_stall_is_reported_once() {
        let t = Tracker::default();
        let op = t.start(false, AR, 8, None, 1_000);
        t.proxy_started(Some(op));
        assert_eq!(t.unreported_stall(1_500, 1_000, false), None, "not yet");
        assert_eq!(t.unreported_stall(2_500, 1_000, false), Some(1_000));
        assert_eq!(t.unreported_stall(9_000, 1_000, false), None, "once");
        t.proxy_stopped(Some(op), 9_100);
        assert_eq!(t.unreported_stall(20_000, 1_000, false), None, "complete");
        let op = t.start(false, AR, 8, None, 30_000);
        t.proxy_started(Some(op));
        assert_eq!(t.unreported_stall(40_000, 1_000, false), Some(30_000));
    }

    #[test]
    fn the_ring_wraps() {
        let t = Tracker::default();
        for i in 0..(RING as u64 * 3) {
            t.start(false, AR, 8, None, i);
        }
        let p = t.progress(false, 0, |x| x);
        assert_eq!(p.coll_started, 3 * RING as u64);
        assert_eq!(p.arrivals.len(), MAX_ARRIVALS);
        assert_eq!(p.arrivals.last().unwrap()[0], 3 * RING as u64);
        assert!(p.check().is_ok());
        assert_eq!(t.op_of((RING * 3 - 1) as u32), RING as u64 * 3 - 1);
    }
}
