//! The writer: a thread of its own that, every interval, finishes stale operations and
//! rewrites the spool file from the aggregates (reading them only). Also the final write
//! at the last `finalize` and a last one when the process exits without finalizing (jobs
//! that never destroy their communicators).

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use heddle_types::observe::{NetUse, SPOOL_FORMAT, SpoolFile};

use crate::engine::{self, STALE_NS, State};
use crate::spool;

pub struct Writer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

/// The file as it stands now.
pub fn snapshot(state: &State, seq: u64, is_final: bool) -> SpoolFile {
    let mut inferred: Option<String> = None;
    let lock = |m: &Mutex<Option<String>>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
    SpoolFile {
        format: SPOOL_FORMAT,
        job: state.identity.clone(),
        seq,
        is_final,
        written_at: chrono::Utc::now(),
        plugin_version: env!("CARGO_PKG_VERSION").to_string(),
        nccl_version: lock(&state.nccl_version),
        env_applied: lock(&state.env_applied),
        comms: state
            .comms
            .iter()
            .filter_map(|c| c.get())
            .map(|c| {
                let mut o = c.observe();
                // Proxy traffic but no network events: name the network from the process.
                if o.net.is_empty() && o.proxy_ops > 0 {
                    let net = inferred.get_or_insert_with(crate::identity::network_in_use);
                    o.net.push(NetUse {
                        net: net.clone(),
                        ops: o.proxy_ops,
                        bytes: 0,
                        inferred: true,
                    });
                }
                o
            })
            .collect(),
        dropped_events: state.dropped_events.load(Relaxed),
        dropped_comms: state.dropped_comms.load(Relaxed),
    }
}

/// Writes the file once (serialised with every other write of this process).
pub fn write(state: &State, is_final: bool) -> io::Result<()> {
    let seq = state.seq.lock().unwrap_or_else(|e| e.into_inner());
    write_locked(state, seq, is_final)
}

/// As `write`, from one of NCCL's own threads (`init`, `finalize`): when another write
/// holds the file for longer than `WAIT` (a spool on a hung filesystem), this one is
/// skipped rather than holding up the job.
pub fn write_from_nccl(state: &State, is_final: bool) -> io::Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        match state.seq.try_lock() {
            Ok(seq) => return write_locked(state, seq, is_final),
            Err(TryLockError::Poisoned(e)) => return write_locked(state, e.into_inner(), is_final),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(TryLockError::WouldBlock) => return Ok(()),
        }
    }
}

/// How long NCCL's threads wait for the writer.
const WAIT: Duration = Duration::from_secs(2);

fn write_locked(state: &State, mut seq: MutexGuard<'_, u64>, is_final: bool) -> io::Result<()> {
    // A forked child inherits the state but is not the process the file is named after.
    if state.identity.pid != std::process::id() {
        return Ok(());
    }
    let bytes = spool::encode(snapshot(state, *seq, is_final));
    state.spool.replace(&bytes)?;
    *seq += 1;
    Ok(())
}

/// Starts the writer thread unless it runs.
pub fn ensure_running(state: &'static State) -> io::Result<()> {
    let mut slot = state.writer.lock().unwrap_or_else(|e| e.into_inner());
    if slot.as_ref().is_some_and(|w| !w.thread.is_finished()) {
        return Ok(());
    }
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let signal = stop.clone();
    let thread = std::thread::Builder::new()
        .name("heddle-profiler".into())
        .spawn(move || {
            let _ = std::panic::catch_unwind(|| run(state, &signal));
        })?;
    *slot = Some(Writer { stop, thread });
    Ok(())
}

fn run(state: &'static State, signal: &(Mutex<bool>, Condvar)) {
    let (stopped, cond) = signal;
    let mut guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // Checked before each wait: a stop may come before the first one.
        if *guard {
            return;
        }
        let (g, _) = cond
            .wait_timeout(guard, state.config.interval)
            .unwrap_or_else(|e| e.into_inner());
        guard = g;
        if *guard || engine::active().is_none() {
            return;
        }
        drop(guard);
        state.pool.sweep(engine::now_ns(), STALE_NS, |slot| {
            engine::finish(state, slot, false)
        });
        if let Err(e) = write(state, false) {
            engine::disable(&format!("cannot write its spool file: {e}"));
            return;
        }
        guard = stopped.lock().unwrap_or_else(|e| e.into_inner());
    }
}

/// Stops the writer thread and waits for it up to `WAIT` (it may be mid-write); past that
/// it is left to finish on its own (`-z nodelete` keeps its code mapped).
pub fn stop(state: &State) {
    let taken = state
        .writer
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

/// Registers (once) a last write when the process exits; `-z nodelete` keeps the handler
/// mapped even after NCCL unloads the plugin.
pub fn register_exit_handler() {
    extern "C" fn at_exit() {
        let _ = std::panic::catch_unwind(|| {
            let Some(state) = engine::active() else {
                return;
            };
            // After the last finalize the final file is written already.
            if !engine::all_finalized(state) {
                let _ = write_from_nccl(state, false);
            }
        });
    }
    // SAFETY: registers a function that never unwinds (it catches panics).
    unsafe { libc::atexit(at_exit) };
}
