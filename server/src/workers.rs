//! Every background loop of a replica, one module each, all of one shape: a [`Worker`] says
//! its name, how often it runs, what one run does and what it does once the server stops;
//! [`start`] runs them all for as long as the server serves and [`Workers::stop`] ends them
//! on the server's shutdown. Each run is counted in `/metrics`
//! (`heddle_worker_runs_total`, `heddle_worker_errors_total`,
//! `heddle_worker_last_run_duration_seconds`, labelled `worker`: docs/metrics.md).
//!
//! | worker | every | on stop |
//! |---|---|---|
//! | [`lease_reaper`] | a quarter heartbeat | dropped |
//! | [`heartbeat_flusher`] | `HEDDLE_HEARTBEAT_FLUSH_MS` | flushes once more |
//! | [`plugin_reconciler`] | 5 s after the last run, or when woken | dropped |
//! | [`job_env_versions`] | 5 s after the last run, or when woken | dropped |
//! | [`investigations`] | a quarter heartbeat, at most 1 s | dropped |
//! | [`revocation_feed`] | half `HEDDLE_REVOCATION_DELAY_MS` (off at 0) | dropped |
//! | [`token_returns`] | half the hold of enrollment token uses | gives back all |
//! | [`tls_reload`] | `HEDDLE_TLS_RELOAD_INTERVAL_S` (HTTPS only) | dropped |
//! | [`history`] | `HEDDLE_HISTORY_INTERVAL_S` | dropped |
//!
//! Every worker runs on every replica: what one run does is safe to do on several at once,
//! by row locks, `SKIP LOCKED` or advisory locks, or because its work is the replica's own
//! (held heartbeats and token uses, its credential cache, its certificate).

pub mod heartbeat_flusher;
pub mod history;
pub mod investigations;
pub mod job_env_versions;
pub mod lease_reaper;
pub mod plugin_reconciler;
pub mod revocation_feed;
pub mod tls_reload;
pub mod token_returns;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::http::tls::CertFiles;
use crate::metrics::Metrics;
use crate::state::AppState;

/// A background loop. Built from the state when the server starts, it keeps what its runs
/// need.
pub trait Worker: Send + 'static {
    /// Its name in logs and in the `worker` label of its metrics.
    const NAME: &'static str;

    /// Whether stopping waits for a run under way and then calls [`Worker::stop`]: for a
    /// worker that holds in memory what must still reach the database. Any other worker's
    /// run is dropped where it stands (what it changes is one transaction, rolled back, or
    /// done again by the next run of any replica).
    const DRAINS: bool = false;

    /// How its failures are logged: `WARN`, or `DEBUG` for a worker whose failure has a
    /// fallback and is expected while the database is away.
    const FAILURES: tracing::Level = tracing::Level::WARN;

    /// From the start of one run to the start of the next; a run that takes longer delays
    /// the next instead of bunching them up. With [`Worker::wake`], from the end of a run.
    fn interval(&self) -> Duration;

    /// How long after a failed run the next one starts, when that differs from the
    /// interval. `None` (every worker here): a failed run is retried at the next interval,
    /// since each of them must keep its pace while the database is away (the reaper's lease
    /// clock, the flusher's heartbeats, the feed's freshness) and a run that finds nothing
    /// to do is cheap.
    fn backoff(&self) -> Option<Duration> {
        None
    }

    /// What starts the next run before the interval is up, if anything does.
    fn wake(&self) -> Option<&Notify> {
        None
    }

    /// One run.
    fn run(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The last run, after the server stopped serving; only called when [`Worker::DRAINS`].
    fn stop(&mut self) -> impl Future<Output = anyhow::Result<()>> + Send {
        async { Ok(()) }
    }
}

/// The running workers of one replica.
pub struct Workers {
    stop: watch::Sender<bool>,
    running: Vec<(&'static str, JoinHandle<()>)>,
}

/// Starts every worker of this replica; `tls` is the certificate to reload when the server
/// speaks HTTPS.
pub fn start(state: &AppState, tls: Option<Arc<CertFiles>>) -> Workers {
    let mut workers = Workers {
        stop: watch::Sender::new(false),
        running: Vec::new(),
    };
    workers.spawn(state, lease_reaper::LeaseReaper::new(state));
    workers.spawn(state, heartbeat_flusher::HeartbeatFlusher::new(state));
    workers.spawn(state, plugin_reconciler::PluginReconciler::new(state));
    workers.spawn(state, job_env_versions::JobEnvVersions::new(state));
    if let Some(feed) = revocation_feed::RevocationFeed::new(state) {
        workers.spawn(state, feed);
    }
    workers.spawn(state, token_returns::TokenReturns::new(state));
    workers.spawn(state, investigations::Investigations::new(state));
    workers.spawn(state, history::History::new(state));
    if let Some(files) = tls {
        workers.spawn(state, tls_reload::TlsReload::new(state, files));
    }
    workers
}

impl Workers {
    fn spawn<W: Worker>(&mut self, state: &AppState, worker: W) {
        let task = tokio::spawn(run(worker, state.metrics.clone(), self.stop.subscribe()));
        self.running.push((W::NAME, task));
    }

    /// Ends every worker: a draining one after its run under way and its last run, any
    /// other at once.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        for (name, task) in self.running {
            if let Err(err) = task.await {
                tracing::warn!(worker = name, error = %err, "background worker ended abnormally");
            }
        }
    }
}

/// Runs `worker` until `stop` turns true (or its sender is gone).
async fn run<W: Worker>(mut worker: W, metrics: Arc<Metrics>, mut stop: watch::Receiver<bool>) {
    metrics.worker_started(W::NAME);
    let mut ticks = tokio::time::interval(worker.interval());
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stopped(&mut stop) => break,
            _ = ticks.tick() => {}
            _ = woken(worker.wake()) => {}
        }
        let ok = if W::DRAINS {
            once::<W>(&metrics, worker.run()).await
        } else {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                ok = once::<W>(&metrics, worker.run()) => ok,
            }
        };
        match (ok, worker.backoff()) {
            (false, Some(backoff)) => ticks.reset_after(backoff),
            _ if worker.wake().is_some() => ticks.reset(),
            _ => {}
        }
    }
    if W::DRAINS {
        once::<W>(&metrics, worker.stop()).await;
    }
}

/// One run, timed, counted and its failure logged; whether it succeeded.
async fn once<W: Worker>(metrics: &Metrics, run: impl Future<Output = anyhow::Result<()>>) -> bool {
    let started = Instant::now();
    let result = run.await;
    metrics.worker_ran(W::NAME, started.elapsed(), result.is_ok());
    if let Err(err) = &result {
        let error = format!("{err:#}");
        if W::FAILURES == tracing::Level::DEBUG {
            tracing::debug!(worker = W::NAME, %error, "background worker failed; will retry");
        } else {
            tracing::warn!(worker = W::NAME, %error, "background worker failed; will retry");
        }
    }
    result.is_ok()
}

/// The outcome of a run whose steps each go on when an earlier one failed: every failure,
/// in order.
fn steps(results: impl IntoIterator<Item = anyhow::Result<()>>) -> anyhow::Result<()> {
    let failed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!(failed.join("; ")))
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error: the sender is gone, which also means stop.
    let _ = stop.wait_for(|stop| *stop).await;
}

async fn woken(wake: Option<&Notify>) {
    match wake {
        Some(wake) => wake.notified().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
