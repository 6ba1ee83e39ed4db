//! Observed jobs: the agent reads what NCCL's profiler plugin (Heddle's, or NCCL
//! Inspector) wrote about the jobs running on this node and uploads it.
//!
//! `ingest.rs` reads the job spool (hostile input: the rules are there), `inspector.rs`
//! NCCL Inspector's logs, `outbox.rs` keeps what is read on the agent's disk until the
//! server has stored it. One loop (`run`) scans, stores and uploads every interval; a
//! spool directory that cannot be used is said once, and the agent goes on without it.

pub mod ingest;
pub mod inspector;
pub mod outbox;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use heddle_types::observed::{
    MAX_OBSERVATIONS_PER_UPLOAD, Observation, ObservationSource, ObservationUpload,
};

use super::{Agent, Backoff, LifecycleError};
use crate::client::ClientError;
use ingest::JobSpool;
use outbox::Outbox;

/// `heddle-agent run`'s settings for observed jobs.
#[derive(Debug, Clone, clap::Args)]
pub struct ObserveArgs {
    /// Directory Heddle's NCCL profiler plugin writes one summary per process into. Created
    /// (mode 1733: anyone may add, only the owner removes) when missing; refused unless it
    /// is the agent's own and sticky. `off` turns reading it off.
    #[arg(
        long,
        env = "HEDDLE_JOB_SPOOL",
        default_value = "/var/spool/heddle/jobs"
    )]
    pub job_spool: PathBuf,
    /// Directory of NCCL Inspector's JSON logs (`NCCL_INSPECTOR_DUMP_DIR`), where a site
    /// already runs it; its jobs are judged on bandwidth only. Unset: not read.
    #[arg(long, env = "HEDDLE_INSPECTOR_DIR")]
    pub inspector_dir: Option<PathBuf>,
    /// How often the spool is read and observations uploaded (`5s`, `1m`).
    #[arg(long, env = "HEDDLE_JOB_SPOOL_INTERVAL", default_value = "5s", value_parser = heddle_types::duration::parse)]
    pub job_spool_interval: Duration,
}

impl ObserveArgs {
    fn spool_path(&self) -> Option<&PathBuf> {
        (self.job_spool.as_os_str() != "off" && !self.job_spool.as_os_str().is_empty())
            .then_some(&self.job_spool)
    }
}

/// The sources a scan reads, each opened once; a source that cannot be used is `None`
/// after one error line.
struct Sources {
    spool: Option<JobSpool>,
    inspector: Option<inspector::InspectorDir>,
}

impl Sources {
    fn open(args: &ObserveArgs) -> Sources {
        let spool = args.spool_path().and_then(|p| match JobSpool::open(p) {
            Ok(s) => {
                tracing::info!(dir = %p.display(), "reading observed jobs from the job spool");
                Some(s)
            }
            Err(err) => {
                tracing::error!("observed jobs are off: {err}");
                None
            }
        });
        let inspector =
            args.inspector_dir
                .as_ref()
                .and_then(|p| match inspector::InspectorDir::open(p) {
                    Ok(d) => Some(d),
                    Err(err) => {
                        tracing::error!("NCCL Inspector logs are not read: {err}");
                        None
                    }
                });
        Sources { spool, inspector }
    }
}

/// How long an operation may be in flight in a file just read before the spool is read
/// again after [`STALLED_RESCAN`] rather than the interval: the profiler plugin writes a
/// stalled job's file at once, and its next writes should reach the server as promptly.
const STALLED_AFTER: Duration = Duration::from_secs(3);
const STALLED_RESCAN: Duration = Duration::from_secs(1);

/// Whether a file shows an operation in flight for longer than [`STALLED_AFTER`] at `now`.
fn looks_stalled(file: &heddle_types::observe::SpoolFile, now: SystemTime) -> bool {
    let now_ns = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    file.comms.iter().any(|c| {
        c.progress.as_ref().is_some_and(|p| {
            p.in_flight.as_ref().is_some_and(|f| {
                now_ns.saturating_sub(f.started_ns) >= STALLED_AFTER.as_nanos() as u64
            })
        })
    })
}

/// Reads every source into the outbox. A job spool file leaves the spool only once its
/// content is durable in the outbox (final, or stale). True when a file read looks
/// stalled ([`looks_stalled`]).
fn collect(sources: &mut Sources, outbox: &mut Outbox) -> bool {
    let now = SystemTime::now();
    let mut stalled = false;
    if let Some(spool) = &mut sources.spool {
        let report = spool.scan(now);
        if report.deferred > 0 {
            tracing::debug!(
                deferred = report.deferred,
                "job spool files left for the next scan"
            );
        }
        for ing in report.ingested {
            stalled |= !ing.file.is_final && looks_stalled(&ing.file, now);
            let obs = Observation {
                source: ObservationSource::Profiler,
                file: ing.file,
            };
            match outbox.put(&obs) {
                Ok(true) => {
                    if obs.file.is_final || ing.stale {
                        spool.remove(&ing.name);
                    }
                }
                Ok(false) => {
                    tracing::warn!(
                        max = outbox::MAX_ENTRIES,
                        "observation outbox is full; the file stays in the job spool"
                    );
                }
                Err(err) => tracing::error!(error = %err, "cannot store an observation"),
            }
        }
    }
    if let Some(dir) = &mut sources.inspector {
        for file in dir.scan() {
            let obs = Observation {
                source: ObservationSource::Inspector,
                file,
            };
            if let Err(err) = outbox.put(&obs) {
                tracing::error!(error = %err, "cannot store an observation");
            }
        }
    }
    stalled
}

/// Uploads the outbox in batches; returns when it is empty or the server is unreachable.
async fn upload(agent: &Agent, outbox: &mut Outbox) -> Result<(), ClientError> {
    loop {
        let batch = outbox.batch(MAX_OBSERVATIONS_PER_UPLOAD);
        if batch.is_empty() {
            return Ok(());
        }
        let (names, observations): (Vec<String>, Vec<Observation>) = batch.into_iter().unzip();
        // Read apart from the call: the lock must not be held while it waits.
        let clock = *agent.clock.lock().expect("clock lock");
        match agent
            .client
            .upload_observations(&ObservationUpload {
                observations,
                clock,
            })
            .await
        {
            Ok(accepted) => {
                tracing::debug!(
                    stored = accepted.stored,
                    unchanged = accepted.unchanged,
                    "observations uploaded"
                );
            }
            // 408/429, or a server from before this route (404): later.
            Err(err) if err.is_transient() || err.status() == Some(404) => return Err(err),
            Err(err @ ClientError::Rejected { .. }) => {
                // Refused for good (the server's checks are the file's own): sending it
                // again cannot help.
                tracing::error!(error = %err, entries = names.len(), "the server refused observations; dropping them");
            }
            Err(err) => return Err(err),
        }
        for name in &names {
            outbox.ack(name);
        }
    }
}

/// The observed-jobs loop. Ends only on a refused credential.
pub(crate) async fn run(
    agent: Arc<Agent>,
    args: ObserveArgs,
    outbox_dir: PathBuf,
) -> Result<std::convert::Infallible, LifecycleError> {
    let mut sources = Sources::open(&args);
    let mut outbox = match Outbox::open(&outbox_dir) {
        Ok(o) => Some(o),
        Err(err) => {
            tracing::error!(error = %err, "observed jobs are off: no outbox");
            None
        }
    };
    let mut backoff = Backoff::new(args.job_spool_interval, agent.cfg.backoff_cap);
    loop {
        let mut delay = args.job_spool_interval;
        if let Some(outbox) = &mut outbox {
            if collect(&mut sources, outbox) {
                delay = delay.min(STALLED_RESCAN);
            }
            match upload(&agent, outbox).await {
                Ok(()) => backoff.reset(),
                Err(ClientError::Unauthorized { message }) => return Err(agent.revoked(message)),
                Err(err) => {
                    delay = backoff.next_delay_after(err.retry_after());
                    tracing::warn!(error = %err, waiting = outbox.len(), retry_in = ?delay,
                        "observations stay in the outbox until the server answers");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = agent.server_back.notified() => {}
        }
    }
}
