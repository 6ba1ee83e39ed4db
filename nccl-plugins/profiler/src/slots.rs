//! The fixed pool of in-flight operations. Allocated once; an operation takes a slot at its
//! start event and gives it back when its last reference goes (its own stop and one stop
//! per kernel channel, in any order, on any thread). No locks: a slot's `state` word holds
//! its generation and reference count and every change is a compare-and-swap on it.
//!
//! Handles given to NCCL are not pointers but (generation, kind, index) packed in a word,
//! so a stale, repeated or foreign handle is recognised and ignored instead of followed.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// Largest pool (handles keep 24 bits of index).
pub const MAX_SLOTS: usize = 1 << 20;
/// Slots looked at for a free one before the event is counted as dropped.
const PROBES: usize = 64;
/// `refs` while the slot is being filled or emptied: busy, but no event may touch it.
const CLAIMING: u32 = u32::MAX - 1;
const FINALIZING: u32 = u32::MAX;

/// What a handle names: the operation itself or one of its kernel channels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Task = 1,
    KernelCh = 2,
    /// A proxy operation: the index is its communicator's, the generation the low 32 bits
    /// of its operation's index (no slot).
    Proxy = 3,
}

/// One cache line each, so threads finishing neighbouring operations do not share lines.
#[derive(Default)]
#[repr(align(64))]
pub struct Slot {
    /// generation << 32 | refs; refs 0 = free.
    state: AtomicU64,
    pub comm: AtomicU32,
    pub row: AtomicU32,
    /// The low 32 bits of the operation's index on its communicator (`progress.rs`); kept
    /// after the slot is freed, until it is taken again.
    pub op: AtomicU32,
    pub bytes: AtomicU64,
    /// algo | proto << 8 | channels << 16.
    pub meta: AtomicU32,
    pub start_ns: AtomicU64,
    pub stop_ns: AtomicU64,
    pub gpu_start: AtomicU64,
    pub gpu_stop: AtomicU64,
}

pub struct Pool {
    slots: Box<[Slot]>,
    mask: usize,
}

// Where this thread looks for a free slot next. Each thread starts in a region of its own
// and walks on from its last slot, so threads do not contend on one cursor. A plain `Cell`
// (no destructor), so no thread-exit hook is registered.
thread_local! {
    static CURSOR: Cell<usize> = const { Cell::new(usize::MAX) };
}
static REGIONS: AtomicUsize = AtomicUsize::new(0);

fn next_cursor() -> usize {
    CURSOR.with(|c| {
        let mut v = c.get();
        if v == usize::MAX {
            // An odd stride spreads the regions over any power-of-two pool.
            v = REGIONS.fetch_add(1, Relaxed).wrapping_mul(4099);
        }
        c.set(v.wrapping_add(1));
        v
    })
}

/// The fields of a new operation.
pub struct Start {
    pub comm: u32,
    pub row: u32,
    pub bytes: u64,
    pub meta: u32,
    pub start_ns: u64,
    pub op: u32,
    /// References: 1 for the operation's stop event, plus one per kernel channel expected.
    pub refs: u32,
}

fn gen_of(state: u64) -> u32 {
    (state >> 32) as u32
}

fn refs_of(state: u64) -> u32 {
    state as u32
}

fn pack(generation: u32, refs: u32) -> u64 {
    ((generation as u64) << 32) | refs as u64
}

pub fn handle(generation: u32, kind: Kind, index: usize) -> usize {
    ((generation as usize) << 32) | ((kind as usize) << 28) | (index + 1)
}

/// (generation, kind, index) of a handle this pool gave out, if it could be one.
pub fn decode(h: usize) -> Option<(u32, Kind, usize)> {
    let index = (h & 0x00ff_ffff).checked_sub(1)?;
    let kind = match (h >> 28) & 0xf {
        1 => Kind::Task,
        2 => Kind::KernelCh,
        3 => Kind::Proxy,
        _ => return None,
    };
    if (h >> 24) & 0xf != 0 {
        return None;
    }
    Some(((h >> 32) as u32, kind, index))
}

impl Pool {
    /// A pool of at least `n` slots (rounded up to a power of two, at most `MAX_SLOTS`).
    pub fn new(n: usize) -> Pool {
        let n = n.clamp(1, MAX_SLOTS).next_power_of_two();
        let slots: Box<[Slot]> = (0..n).map(|_| Slot::default()).collect();
        for s in slots.iter() {
            s.state.store(pack(1, 0), Relaxed);
        }
        Pool { slots, mask: n - 1 }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Takes a free slot for a new operation; its task handle, or `None` when the probed
    /// slots are all busy.
    pub fn claim(&self, start: &Start) -> Option<usize> {
        let first = next_cursor();
        for i in 0..PROBES.min(self.slots.len()) {
            let index = (first + i) & self.mask;
            let slot = &self.slots[index];
            let s = slot.state.load(Relaxed);
            if refs_of(s) != 0 {
                continue;
            }
            let generation = gen_of(s);
            if slot
                .state
                .compare_exchange(s, pack(generation, CLAIMING), Acquire, Relaxed)
                .is_err()
            {
                continue;
            }
            slot.comm.store(start.comm, Relaxed);
            slot.row.store(start.row, Relaxed);
            slot.op.store(start.op, Relaxed);
            slot.bytes.store(start.bytes, Relaxed);
            slot.meta.store(start.meta, Relaxed);
            slot.start_ns.store(start.start_ns, Relaxed);
            slot.stop_ns.store(0, Relaxed);
            slot.gpu_start.store(u64::MAX, Relaxed);
            slot.gpu_stop.store(0, Relaxed);
            slot.state
                .store(pack(generation, start.refs.clamp(1, CLAIMING - 1)), Release);
            return Some(handle(generation, Kind::Task, index));
        }
        None
    }

    /// The slot a live handle names; `None` for a handle that is stale (its operation is
    /// over), malformed, or of another pool.
    pub fn live(&self, generation: u32, index: usize) -> Option<&Slot> {
        let slot = self.slots.get(index)?;
        let s = slot.state.load(Acquire);
        let refs = refs_of(s);
        (gen_of(s) == generation && refs != 0 && refs < CLAIMING).then_some(slot)
    }

    /// The operation (low 32 bits of its index) of a task handle, while its slot is live or
    /// freed and not yet taken again: NCCL starts an operation's proxy operations after its
    /// stop event may have freed the slot, naming the operation's handle as their parent.
    pub fn op_of(&self, h: usize) -> Option<u32> {
        let (generation, Kind::Task, index) = decode(h)? else {
            return None;
        };
        let slot = self.slots.get(index)?;
        let s = slot.state.load(Acquire);
        let ours = match refs_of(s) {
            0 => gen_of(s) == generation.wrapping_add(1).max(1),
            r => gen_of(s) == generation && r < CLAIMING,
        };
        if !ours {
            return None;
        }
        let op = slot.op.load(Relaxed);
        std::sync::atomic::fence(Acquire);
        (slot.state.load(Relaxed) == s).then_some(op)
    }

    /// Drops one reference. When it was the last, `finish` gets the slot exclusively
    /// (to add the operation to its row) and the slot is then free, under a new generation
    /// so that every outstanding handle to it goes stale.
    pub fn release(&self, generation: u32, index: usize, finish: impl FnOnce(&Slot)) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let mut s = slot.state.load(Acquire);
        loop {
            let refs = refs_of(s);
            if gen_of(s) != generation || refs == 0 || refs >= CLAIMING {
                return;
            }
            let next = if refs == 1 {
                pack(generation, FINALIZING)
            } else {
                s - 1
            };
            match slot.state.compare_exchange_weak(s, next, AcqRel, Acquire) {
                Ok(_) if refs == 1 => {
                    finish(slot);
                    slot.state
                        .store(pack(generation.wrapping_add(1).max(1), 0), Release);
                    return;
                }
                Ok(_) => return,
                Err(now) => s = now,
            }
        }
    }

    /// Finishes operations that started more than `max_age_ns` ago and still wait for
    /// events (kernel channel events that NCCL did not send, e.g. for work it ran
    /// without the profiler's proxy): they are counted without a GPU time and their slots
    /// freed. Returns how many. Runs on the writer thread.
    pub fn sweep(&self, now_ns: u64, max_age_ns: u64, mut finish: impl FnMut(&Slot)) -> u64 {
        let mut swept = 0;
        for slot in self.slots.iter() {
            let s = slot.state.load(Acquire);
            let refs = refs_of(s);
            if refs == 0 || refs >= CLAIMING {
                continue;
            }
            if now_ns.saturating_sub(slot.start_ns.load(Relaxed)) < max_age_ns {
                continue;
            }
            let generation = gen_of(s);
            if slot
                .state
                .compare_exchange(s, pack(generation, FINALIZING), AcqRel, Relaxed)
                .is_ok()
            {
                finish(slot);
                slot.state
                    .store(pack(generation.wrapping_add(1).max(1), 0), Release);
                swept += 1;
            }
        }
        swept
    }

    /// Slots in use now.
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| refs_of(s.state.load(Relaxed)) != 0)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(refs: u32) -> Start {
        Start {
            comm: 0,
            row: 0,
            bytes: 8,
            meta: 0,
            start_ns: 100,
            op: 7,
            refs,
        }
    }

    #[test]
    fn handles_round_trip_and_reject_garbage() {
        let h = handle(7, Kind::KernelCh, 12345);
        assert_eq!(decode(h), Some((7, Kind::KernelCh, 12345)));
        assert_eq!(decode(0), None);
        assert_eq!(decode(0x7fff_0000_1000), None);
        assert_eq!(decode(0x5555_5f3a_2c10), None);
    }

    #[test]
    fn last_reference_finishes_once_and_stale_handles_are_ignored() {
        let pool = Pool::new(2);
        let h = pool.claim(&start(3)).unwrap();
        let (g, _, i) = decode(h).unwrap();
        let mut finished = 0;
        pool.release(g, i, |_| finished += 1);
        pool.release(g, i, |_| finished += 1);
        assert_eq!(finished, 0);
        pool.release(g, i, |_| finished += 1);
        assert_eq!(finished, 1);
        // The handle is stale now: more releases do nothing, even once the slot is reused.
        pool.release(g, i, |_| finished += 1);
        assert!(pool.live(g, i).is_none());
        let _ = pool.claim(&start(1)).unwrap();
        let _ = pool.claim(&start(1)).unwrap();
        pool.release(g, i, |_| finished += 1);
        assert_eq!(finished, 1);
        assert_eq!(pool.in_use(), 2);
        assert!(pool.claim(&start(1)).is_none(), "full pool refuses");
    }

    #[test]
    fn an_operation_is_known_by_its_handle_until_the_slot_is_taken_again() {
        let pool = Pool::new(1);
        let h = pool.claim(&start(1)).unwrap();
        assert_eq!(pool.op_of(h), Some(7));
        let (g, _, i) = decode(h).unwrap();
        pool.release(g, i, |_| ());
        assert_eq!(pool.op_of(h), Some(7), "freed, not reused");
        let mut next = start(1);
        next.op = 8;
        let h2 = pool.claim(&next).unwrap();
        assert_eq!(pool.op_of(h), None, "taken again");
        assert_eq!(pool.op_of(h2), Some(8));
        assert_eq!(pool.op_of(handle(0, Kind::KernelCh, 0)), None);
    }

    #[test]
    fn a_slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }

    #[test]
    fn sweep_frees_old_operations() {
        let pool = Pool::new(4);
        let h = pool.claim(&start(5)).unwrap();
        let (g, _, i) = decode(h).unwrap();
        assert_eq!(pool.sweep(200, 1000, |_| ()), 0);
        assert_eq!(pool.sweep(2000, 1000, |_| ()), 1);
        assert!(pool.live(g, i).is_none());
        assert_eq!(pool.in_use(), 0);
    }
}
