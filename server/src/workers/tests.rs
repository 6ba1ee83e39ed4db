use std::sync::Mutex;

use super::*;

/// What a probe worker did, in order.
#[derive(Debug, Clone, PartialEq)]
enum Did {
    Started,
    Finished,
    Failed,
    Stopped,
}

/// A worker whose runs take `takes`, fail when `fails` says so, and note what they did.
struct Probe<const DRAINS: bool> {
    interval: Duration,
    backoff: Option<Duration>,
    takes: Duration,
    fails: fn(usize) -> bool,
    wake: Option<Arc<Notify>>,
    did: Arc<Mutex<Vec<Did>>>,
}

impl<const DRAINS: bool> Probe<DRAINS> {
    fn new(interval: Duration) -> Self {
        Probe {
            interval,
            backoff: None,
            takes: Duration::ZERO,
            fails: |_| false,
            wake: None,
            did: Arc::default(),
        }
    }
}

impl<const DRAINS: bool> Worker for Probe<DRAINS> {
    const NAME: &'static str = "probe";
    const DRAINS: bool = DRAINS;

    fn interval(&self) -> Duration {
        self.interval
    }

    fn backoff(&self) -> Option<Duration> {
        self.backoff
    }

    fn wake(&self) -> Option<&Notify> {
        self.wake.as_deref()
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        let n = {
            let mut did = self.did.lock().unwrap();
            did.push(Did::Started);
            did.iter().filter(|d| **d == Did::Started).count()
        };
        tokio::time::sleep(self.takes).await;
        if (self.fails)(n) {
            self.did.lock().unwrap().push(Did::Failed);
            anyhow::bail!("run {n} failed on purpose");
        }
        self.did.lock().unwrap().push(Did::Finished);
        Ok(())
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        self.did.lock().unwrap().push(Did::Stopped);
        Ok(())
    }
}

/// Starts `worker` the way [`start`] does; its metrics, its notes and what stops it.
fn spawn<const D: bool>(worker: Probe<D>) -> (Arc<Metrics>, Arc<Mutex<Vec<Did>>>, Workers) {
    let metrics = Arc::new(Metrics::new());
    let did = worker.did.clone();
    let mut workers = Workers {
        stop: watch::Sender::new(false),
        running: Vec::new(),
    };
    let task = tokio::spawn(run(worker, metrics.clone(), workers.stop.subscribe()));
    workers.running.push(("probe", task));
    (metrics, did, workers)
}

fn series(metrics: &Metrics, name: &str) -> f64 {
    let (_, text) = metrics.encode(&Default::default());
    let line = format!("{name}{{worker=\"probe\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .unwrap_or_else(|| panic!("no {line} in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn runs_every_interval_and_counts_runs_and_failures() {
    let mut probe = Probe::<false>::new(Duration::from_millis(40));
    probe.fails = |n| n % 2 == 0;
    let (metrics, did, workers) = spawn(probe);
    tokio::time::sleep(Duration::from_millis(190)).await;
    workers.stop().await;
    let did = did.lock().unwrap().clone();
    let runs = did.iter().filter(|d| **d == Did::Started).count();
    let failed = did.iter().filter(|d| **d == Did::Failed).count();
    // At 0, 40, 80, 120 and 160 ms (a loaded machine may give fewer, never more).
    assert!((3..=5).contains(&runs), "{did:?}");
    assert_eq!(failed, runs / 2, "{did:?}");
    assert_eq!(series(&metrics, "heddle_worker_runs_total"), runs as f64);
    assert_eq!(
        series(&metrics, "heddle_worker_errors_total"),
        failed as f64
    );
    assert!(series(&metrics, "heddle_worker_last_run_duration_seconds") < 0.04);
    assert!(
        !did.contains(&Did::Stopped),
        "only a draining worker runs on stop"
    );
}

#[tokio::test]
async fn its_series_exist_before_it_runs() {
    let (metrics, _, workers) = spawn(Probe::<false>::new(Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(series(&metrics, "heddle_worker_errors_total"), 0.0);
    workers.stop().await;
}

#[tokio::test]
async fn stop_drops_a_run_under_way_unless_the_worker_drains() {
    let mut cut = Probe::<false>::new(Duration::from_secs(60));
    cut.takes = Duration::from_secs(30);
    let (_, did, workers) = spawn(cut);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    workers.stop().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(*did.lock().unwrap(), [Did::Started]);

    let mut drains = Probe::<true>::new(Duration::from_secs(60));
    drains.takes = Duration::from_millis(200);
    let (metrics, did, workers) = spawn(drains);
    tokio::time::sleep(Duration::from_millis(20)).await;
    workers.stop().await;
    assert_eq!(
        *did.lock().unwrap(),
        [Did::Started, Did::Finished, Did::Stopped]
    );
    // The last run counts too.
    assert_eq!(series(&metrics, "heddle_worker_runs_total"), 2.0);
}

#[tokio::test]
async fn a_wake_starts_the_next_run_before_the_interval_is_up() {
    let wake = Arc::new(Notify::new());
    let mut probe = Probe::<false>::new(Duration::from_secs(60));
    probe.wake = Some(wake.clone());
    let (_, did, workers) = spawn(probe);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(did.lock().unwrap().len(), 2, "the first run, at once");
    wake.notify_waiters();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        *did.lock().unwrap(),
        [Did::Started, Did::Finished, Did::Started, Did::Finished]
    );
    workers.stop().await;
}

#[tokio::test]
async fn a_failed_run_is_retried_after_the_backoff() {
    let mut probe = Probe::<false>::new(Duration::from_secs(60));
    probe.backoff = Some(Duration::from_millis(30));
    probe.fails = |n| n == 1;
    let (_, did, workers) = spawn(probe);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Failed at once, retried 30 ms later, then back to the 60 s interval.
    assert_eq!(
        *did.lock().unwrap(),
        [Did::Started, Did::Failed, Did::Started, Did::Finished]
    );
    workers.stop().await;
}

#[tokio::test]
async fn a_worker_without_a_backoff_retries_at_its_interval() {
    let mut probe = Probe::<false>::new(Duration::from_millis(100));
    probe.fails = |_| true;
    let runs = {
        let (_, did, workers) = spawn(probe);
        tokio::time::sleep(Duration::from_millis(50)).await;
        workers.stop().await;
        did.lock().unwrap().clone()
    };
    assert_eq!(runs, [Did::Started, Did::Failed]);
}
