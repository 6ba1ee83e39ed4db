//! The engine's state as the writer sees it ([`writer::Source`]): the spool file it makes
//! of the aggregates, and the work before each periodic write.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use heddle_types::observe::{NetUse, SPOOL_FORMAT, SpoolFile};

use crate::engine::{self, STALE_NS, State};
use crate::spool::SpoolDir;
use crate::writer::{self, Writer};

/// CLOCK_REALTIME in ns since the Unix epoch.
fn wall_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the struct; CLOCK_REALTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

impl writer::Source for State {
    fn snapshot(&self, seq: u64, is_final: bool) -> SpoolFile {
        let mut inferred: Option<String> = None;
        // Monotonic times in the file are given on the wall clock, by its offset now.
        let mono = engine::now_ns();
        let real = wall_ns();
        let to_real = |t: u64| t.wrapping_add(real.wrapping_sub(mono));
        let kernel_always = self.config.kernel_always();
        let lock = |m: &Mutex<Option<String>>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
        SpoolFile {
            format: SPOOL_FORMAT,
            job: self.identity.clone(),
            seq,
            is_final,
            written_at: chrono::Utc::now(),
            plugin_version: env!("CARGO_PKG_VERSION").to_string(),
            nccl_version: lock(&self.nccl_version),
            env_applied: lock(&self.env_applied),
            comms: self
                .comms
                .iter()
                .filter_map(|c| c.get())
                .map(|c| {
                    let mut o = c.observe();
                    o.progress = Some(c.progress.progress(kernel_always, real, to_real));
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
            dropped_events: self.dropped_events.load(Relaxed),
            dropped_comms: self.dropped_comms.load(Relaxed),
        }
    }

    fn seq(&self) -> &Mutex<u64> {
        &self.seq
    }

    fn spool(&self) -> &SpoolDir {
        &self.spool
    }

    fn pid(&self) -> u32 {
        self.identity.pid
    }

    fn interval(&self) -> Duration {
        self.config.interval
    }

    fn writer(&self) -> &Mutex<Option<Writer>> {
        &self.writer
    }

    fn tick(&self) -> bool {
        if engine::active().is_none() {
            return false;
        }
        self.pool.sweep(engine::now_ns(), STALE_NS, |slot| {
            engine::finish(self, slot, false)
        });
        true
    }

    fn write_failed(&self, e: &io::Error) {
        engine::disable(&format!("cannot write its spool file: {e}"));
    }

    fn urgent(&self) -> bool {
        if engine::active().is_none() {
            return false;
        }
        let (now, limit) = (engine::now_ns(), self.config.stall.as_nanos() as u64);
        let kernel_always = self.config.kernel_always();
        // Every communicator is asked, so that each marks its stall as written.
        self.comms
            .iter()
            .filter_map(|c| c.get())
            .filter(|c| {
                c.progress
                    .unreported_stall(now, limit, kernel_always)
                    .is_some()
            })
            .count()
            > 0
    }

    fn sample_window(&self) -> Option<Duration> {
        self.config.kernel_window()
    }

    fn set_sampling(&self, on: bool) {
        self.set_kernel_events(on);
    }
}
