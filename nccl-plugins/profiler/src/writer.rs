//! The writer: a thread of its own that, every interval, finishes stale operations and
//! rewrites the spool file from the aggregates (reading them only). Also the final write
//! at the last `finalize` and a last one when the process exits without finalizing (jobs
//! that never destroy their communicators). It knows the engine only as a [`Source`]
//! (`source.rs`), so the engine calls it and it never calls back into the engine's module.

use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use heddle_types::observe::SpoolFile;

use crate::spool::{self, SpoolDir};

pub struct Writer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

/// What the writer writes and keeps up to date.
pub trait Source: Sync + 'static {
    /// The file as it stands now.
    fn snapshot(&self, seq: u64, is_final: bool) -> SpoolFile;
    /// The next sequence number; held while a file is written.
    fn seq(&self) -> &Mutex<u64>;
    fn spool(&self) -> &SpoolDir;
    /// The process the file is named after: a forked child inherits the source, not the
    /// file.
    fn pid(&self) -> u32;
    /// How often the thread writes.
    fn interval(&self) -> Duration;
    /// The thread's slot.
    fn writer(&self) -> &Mutex<Option<Writer>>;
    /// What comes before each periodic write (finishing stale operations); false when
    /// the source is no longer recording, which stops the thread.
    fn tick(&self) -> bool;
    /// A periodic write failed; the thread stops after this.
    fn write_failed(&self, e: &io::Error);
    /// Something has looked stalled for longer than the stall limit since the last write
    /// (asked every [`POLL`]): the file is written now, not at the end of the interval.
    fn urgent(&self) -> bool;
    /// How long at the start of each interval something is sampled (kernel channel events),
    /// when only part of each interval is.
    fn sample_window(&self) -> Option<Duration>;
    /// Sampling on (at the start of an interval) or off (at the end of its window).
    fn set_sampling(&self, on: bool);
}

/// Writes the file once (serialised with every other write of this process).
pub fn write<S: Source>(source: &S, is_final: bool) -> io::Result<()> {
    let seq = source.seq().lock().unwrap_or_else(|e| e.into_inner());
    write_locked(source, seq, is_final)
}

/// As `write`, from one of NCCL's own threads (`init`, `finalize`): when another write
/// holds the file for longer than `WAIT` (a spool on a hung filesystem), this one is
/// skipped rather than holding up the job.
pub fn write_from_nccl<S: Source>(source: &S, is_final: bool) -> io::Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        match source.seq().try_lock() {
            Ok(seq) => return write_locked(source, seq, is_final),
            Err(TryLockError::Poisoned(e)) => {
                return write_locked(source, e.into_inner(), is_final);
            }
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(TryLockError::WouldBlock) => return Ok(()),
        }
    }
}

/// How often the thread asks whether something stalled.
pub const POLL: Duration = Duration::from_millis(250);

/// How long NCCL's threads wait for the writer.
const WAIT: Duration = Duration::from_secs(2);

fn write_locked<S: Source>(
    source: &S,
    mut seq: MutexGuard<'_, u64>,
    is_final: bool,
) -> io::Result<()> {
    // A forked child inherits the state but is not the process the file is named after.
    if source.pid() != std::process::id() {
        return Ok(());
    }
    let bytes = spool::encode(source.snapshot(*seq, is_final));
    source.spool().replace(&bytes)?;
    *seq += 1;
    Ok(())
}

/// Starts the writer thread unless it runs.
pub fn ensure_running<S: Source>(source: &'static S) -> io::Result<()> {
    let mut slot = source.writer().lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_some_and(|w| !w.thread.is_finished()) {
        return Ok(());
    }
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let signal = stop.clone();
    let thread = std::thread::Builder::new()
        .name("heddle-profiler".into())
        .spawn(move || {
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| run(source, &signal)));
        })?;
    *slot = Some(Writer { stop, thread });
    Ok(())
}

/// Each interval: the sampling window from its start (when there is one), then the rest
/// of the interval without, then the write, and sampling on again for the next.
fn run<S: Source>(source: &'static S, signal: &(Mutex<bool>, Condvar)) {
    let window = source.sample_window();
    if window.is_some() {
        source.set_sampling(true);
    }
    loop {
        let rest = match window {
            Some(w) => {
                if !watch(source, signal, w) {
                    return;
                }
                source.set_sampling(false);
                source.interval().saturating_sub(w)
            }
            None => source.interval(),
        };
        if !watch(source, signal, rest) {
            return;
        }
        if !source.tick() {
            return;
        }
        if let Err(e) = write(source, false) {
            source.write_failed(&e);
            return;
        }
        if window.is_some() {
            source.set_sampling(true);
        }
    }
}

/// Waits `d` as `wait` does, writing the file whenever something stalled meanwhile; false
/// when stopped or a write failed.
fn watch<S: Source>(source: &S, signal: &(Mutex<bool>, Condvar), d: Duration) -> bool {
    let deadline = Instant::now() + d;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if !wait(signal, left.min(POLL)) {
            return false;
        }
        if source.urgent()
            && let Err(e) = write(source, false)
        {
            source.write_failed(&e);
            return false;
        }
        if left <= POLL {
            return true;
        }
    }
}

/// Waits `d` unless stopped first (also before the wait: a stop may come before it);
/// false when stopped.
fn wait(signal: &(Mutex<bool>, Condvar), d: Duration) -> bool {
    let (stopped, cond) = signal;
    let deadline = Instant::now() + d;
    let mut guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if *guard {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        guard = cond
            .wait_timeout(guard, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Stops the writer thread and waits for it up to `WAIT` (it may be mid-write); past that
/// it is left to finish on its own (`-z nodelete` keeps its code mapped).
pub fn stop<S: Source>(source: &S) {
    let taken = source
        .writer()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(w) = taken {
        *w.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        w.stop.1.notify_all();
        let deadline = Instant::now() + WAIT;
        while !w.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if w.thread.is_finished() {
            let _ = w.thread.join();
        }
    }
}
