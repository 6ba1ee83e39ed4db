//! The stall watch's rules, shared by the supervisor of test children and by
//! `heddle-agent bench`'s own watch: how long silence may last ([`StallLimit`], the plan's
//! worst step, the [`Pace`] shown so far) and where a silent test stopped ([`stage`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heddle_types::jobs::ResultRow;

/// How long a child may stay silent (no row, no progress event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallLimit {
    /// Silence allowed beyond the slowest step the child declared.
    pub beyond_slowest: Duration,
    /// Watch from the start. Otherwise the watch starts with the child's plan: a child
    /// that declares none (a kind that cannot hang on a peer) is never judged hung.
    pub from_start: bool,
}

/// Where a hung child was, and how long it had been silent.
#[derive(Debug, Clone, PartialEq)]
pub struct Hang {
    pub silent_for: Duration,
    pub limit: Duration,
    /// `init` (no size finished) or `size <bytes>` (the size it never finished).
    pub stage: String,
    /// The last size that finished, if any.
    pub last_size_bytes: Option<i64>,
}

/// The summary key of a hung test: `{stage, silent_s, limit_s, last_size_bytes}`.
pub const HUNG_KEY: &str = "hung";

/// Where a silent child stopped: before any size finished it was setting up its
/// communicator (or running the first size); otherwise at the planned size after the
/// last one it reported.
pub fn stage(plan: &[i64], rows: &[ResultRow]) -> (String, Option<i64>) {
    stage_after(plan, rows.last().map(|r| r.size_bytes))
}

/// [`stage`] from the last size that finished.
pub fn stage_after(plan: &[i64], last: Option<i64>) -> (String, Option<i64>) {
    let Some(last) = last else {
        return match plan.first() {
            Some(first) => (format!("init (or the first size, {first} B)"), None),
            None => ("init".into(), None),
        };
    };
    match plan.iter().find(|&&s| s > last) {
        Some(next) => (format!("size {next} B"), Some(last)),
        None => (format!("size {last} B or after it"), Some(last)),
    }
}

/// What the child declared it will do.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub sizes_bytes: Vec<i64>,
    /// The longest any step may take, set-up included, not knowing the fabric's speed.
    pub slowest_step: Duration,
}

/// How many times the pace measured so far the next size may take before it counts as
/// stuck: bandwidth grows with size up to the link's rate, so time grows at most in
/// proportion to bytes, and this leaves room for noise and a slower protocol.
const PACE_MARGIN: f64 = 4.0;

/// The pace a test has shown: the wall time of the last size it finished. Once it has
/// finished one size, the next size is allowed that time scaled by bytes (with
/// [`PACE_MARGIN`]) instead of the plan's worst case, so a test stuck after a run of fast
/// sizes is found within the stall limit rather than minutes later.
#[derive(Debug, Clone, Default)]
pub struct Pace {
    /// The last size that finished and how long it took.
    last: Option<(i64, Duration)>,
    /// When the size being measured started (the previous size's end, or the plan).
    size_started: Option<Instant>,
    current: Option<i64>,
}

impl Pace {
    /// The plan arrived: set-up and the first size start now.
    pub fn planned(&mut self, at: Instant) {
        self.size_started = Some(at);
    }

    /// A row of `size` arrived at `at`. Rows of one size (out-of-place, in-place) end it
    /// together; a new size ends the previous one.
    pub fn row(&mut self, size: i64, at: Instant) {
        if self.current == Some(size) {
            return;
        }
        if let Some(started) = self.size_started {
            self.last = Some((size, at.saturating_duration_since(started)));
        }
        self.current = Some(size);
        self.size_started = Some(at);
    }

    /// The silence allowed for the step under way, beyond the stall limit.
    pub fn step_allowance(&self, plan: &Plan) -> Duration {
        let Some((last_size, took)) = self.last else {
            return plan.slowest_step;
        };
        let next = plan
            .sizes_bytes
            .iter()
            .copied()
            .find(|&s| s > last_size)
            .unwrap_or(last_size);
        let ratio = (next.max(1) as f64 / last_size.max(1) as f64).max(1.0);
        let paced = took.as_secs_f64() * ratio * PACE_MARGIN;
        Duration::from_secs_f64(paced.min(plan.slowest_step.as_secs_f64()))
    }
}

/// A stall watch inside the process that runs the test (`heddle-agent bench`, which has
/// no supervisor): a thread that calls `on_hang` once when silence outlasts the limit plus
/// the step's allowance. Rows are reported with [`Watchdog::row`]; dropping it stops the
/// thread.
pub struct Watchdog {
    shared: Arc<WatchShared>,
}

struct WatchShared {
    state: Mutex<WatchState>,
    done: AtomicBool,
}

struct WatchState {
    plan: Plan,
    pace: Pace,
    last_sign: Instant,
    last_size: Option<i64>,
}

/// How often the watchdog looks.
const WATCH_TICK: Duration = Duration::from_millis(200);

impl Watchdog {
    pub fn start(limit: Duration, plan: Plan, on_hang: impl FnOnce(Hang) + Send + 'static) -> Self {
        let now = Instant::now();
        let mut pace = Pace::default();
        pace.planned(now);
        let shared = Arc::new(WatchShared {
            state: Mutex::new(WatchState {
                plan,
                pace,
                last_sign: now,
                last_size: None,
            }),
            done: AtomicBool::new(false),
        });
        let watched = shared.clone();
        std::thread::Builder::new()
            .name("stall-watch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(WATCH_TICK);
                    if watched.done.load(Ordering::Acquire) {
                        return;
                    }
                    let st = watched.state.lock().unwrap_or_else(|e| e.into_inner());
                    let allowed = limit + st.pace.step_allowance(&st.plan);
                    let silent = st.last_sign.elapsed();
                    if silent > allowed {
                        let (stage, last_size_bytes) =
                            stage_after(&st.plan.sizes_bytes, st.last_size);
                        drop(st);
                        on_hang(Hang {
                            silent_for: silent,
                            limit: allowed,
                            stage,
                            last_size_bytes,
                        });
                        return;
                    }
                }
            })
            .expect("spawn the stall watch thread");
        Watchdog { shared }
    }

    /// A row of `size` bytes finished now.
    pub fn row(&self, size: i64) {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        st.last_sign = now;
        st.pace.row(size, now);
        st.last_size = Some(size);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.done.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(sizes: &[i64], slowest_s: u64) -> Plan {
        Plan {
            sizes_bytes: sizes.to_vec(),
            slowest_step: Duration::from_secs(slowest_s),
        }
    }

    #[test]
    fn the_plan_bounds_the_first_step_and_the_pace_the_later_ones() {
        let p = plan(&[1 << 20, 1 << 22, 1 << 30], 120);
        let t0 = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(pace.step_allowance(&p), Duration::from_secs(120));
        pace.planned(t0);
        // 1 MiB took 2 s (set-up included); both of its rows count once.
        pace.row(1 << 20, t0 + Duration::from_secs(2));
        pace.row(1 << 20, t0 + Duration::from_secs(3));
        // Next is 4 MiB: 2 s x 4 (bytes) x PACE_MARGIN.
        assert_eq!(pace.step_allowance(&p), Duration::from_secs(32));
        // 4 MiB took 0.5 s; 1 GiB next: 0.5 x 256 x 4 = 512 s, capped by the plan's 120.
        pace.row(1 << 22, t0 + Duration::from_millis(2500));
        assert_eq!(pace.step_allowance(&p), Duration::from_secs(120));
        // After the last size: the last size's own pace.
        pace.row(1 << 30, t0 + Duration::from_millis(2600));
        assert_eq!(pace.step_allowance(&p), Duration::from_millis(400));
    }

    #[test]
    fn where_a_silent_test_stopped() {
        let row = |size| ResultRow {
            size_bytes: size,
            ..Default::default()
        };
        assert_eq!(stage(&[8, 16], &[]).0, "init (or the first size, 8 B)");
        assert_eq!(stage(&[8, 16], &[row(8)]), ("size 16 B".into(), Some(8)));
        assert_eq!(stage(&[8, 16], &[row(16)]).0, "size 16 B or after it");
    }

    #[test]
    fn the_watchdog_fires_once_on_silence_and_not_while_rows_come() {
        let (tx, rx) = std::sync::mpsc::channel();
        let dog = Watchdog::start(
            Duration::from_millis(300),
            plan(&[8, 16, 32], 0),
            move |h| {
                tx.send(h).unwrap();
            },
        );
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(150));
            dog.row(8);
        }
        assert!(rx.try_recv().is_err(), "rows keep it quiet");
        dog.row(16);
        let hang = rx.recv_timeout(Duration::from_secs(5)).expect("a hang");
        assert_eq!(hang.stage, "size 32 B");
        assert_eq!(hang.last_size_bytes, Some(16));
        assert!(hang.silent_for >= Duration::from_millis(300), "{hang:?}");
        assert!(rx.recv_timeout(Duration::from_millis(600)).is_err(), "once");
    }

    #[test]
    fn a_dropped_watchdog_never_fires() {
        let (tx, rx) = std::sync::mpsc::channel();
        let dog = Watchdog::start(Duration::from_millis(100), plan(&[8], 0), move |h| {
            tx.send(h).unwrap();
        });
        drop(dog);
        assert!(rx.recv_timeout(Duration::from_millis(600)).is_err());
    }
}
