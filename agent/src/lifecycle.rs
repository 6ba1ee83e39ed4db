//! The agent's life: enroll once, then heartbeat, report facts, claim jobs, run each in a
//! child process, and upload results through the spool.
//!
//! Everything runs on one current-thread tokio runtime: the agent mostly waits, and a
//! single thread keeps its footprint small (the tests themselves run in child processes).
//! The loops are independent tasks that share an [`Agent`]:
//! - `upload`: drains the spool, oldest first; the claim loop starts only after the
//!   first drain, so results from before a restart go out first; results the disk
//!   refused are held in memory (`held`) and uploaded from there;
//! - `report`: heartbeats (which also renew leases and carry cancellations) and facts;
//! - `job`: claims, runs, renews and spools;
//! - `observe`: reads what the NCCL profiler plugin and NCCL Inspector wrote about the
//!   node's jobs and uploads it.
//!
//! A network error never ends the agent: each loop retries with [`Backoff`]. Only a
//! refused credential (401) does, with exit status 6 (`crate::exit`), because retrying cannot fix it.

mod backoff;
pub mod facts_link;
mod held;
mod job;
pub mod node_env;
pub mod observe;
mod report;
pub mod state;
mod upload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use heddle_types::agent::EnrollRequest;
use tokio::sync::{Notify, mpsc, watch};
use uuid::Uuid;

pub use backoff::Backoff;

use crate::client::{Client, ClientError, EnrollOutcome};
use crate::runner::supervise::StopReason;
use crate::spool::{Spool, SpoolError, SpoolId};
use state::{Identity, PendingTicket, StateDir, StateError};

pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Most jobs one heartbeat may name (the server refuses more).
const MAX_HEARTBEAT_JOBS: usize = 1024;
/// How long a shutdown waits for children to die and for a last spool upload.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Server base URL, e.g. `http://heddle:8080`. Repeat the flag or separate URLs with
    /// commas to list replicas; the agent fails over between them. `HEDDLE_URL` is the
    /// variable the CLI reads too; `HEDDLE_SERVER`, its older name, is read when it is unset.
    #[arg(long = "server", env = "HEDDLE_URL", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Trust for `https://` servers: `--ca-file`, `--pin-sha256`.
    #[command(flatten)]
    pub tls: heddle_tls::ClientTls,
    /// One-time enrollment token. Only read while the state directory holds no
    /// credential; once enrolled the agent never enrolls again.
    #[arg(long, env = "HEDDLE_ENROLL_TOKEN", hide_env_values = true)]
    pub enroll_token: Option<String>,
    /// Holds the credential (0600), the result spool and a lock against a second agent.
    #[arg(
        long,
        env = "HEDDLE_STATE_DIR",
        default_value = "/var/lib/heddle-agent"
    )]
    pub state_dir: PathBuf,
    /// Name this node enrolls under; defaults to the kernel's host name.
    #[arg(long, env = "HEDDLE_HOSTNAME")]
    pub hostname: Option<String>,
    /// Jobs run at the same time. One keeps measurements from disturbing each other.
    #[arg(long, env = "HEDDLE_MAX_PARALLEL", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_parallel: u32,
    /// Pause before asking again when no job is queued (`500ms`, `5s`, `1m`).
    #[arg(long, env = "HEDDLE_CLAIM_INTERVAL", default_value = "5s", value_parser = heddle_types::duration::parse)]
    pub claim_interval: Duration,
    /// Filesystem root the facts are read from: `/host` when the agent runs in a container
    /// with the host's `/sys` and `/proc` mounted there. NVML and verbs are consulted only
    /// for `/`.
    #[arg(long, env = "HEDDLE_FACTS_ROOT", default_value = "/")]
    pub facts_root: PathBuf,
    /// How often facts are collected again to notice a change (a new GPU, a port down).
    #[arg(long, env = "HEDDLE_FACTS_INTERVAL", default_value = "5m", value_parser = heddle_types::duration::parse)]
    pub facts_interval: Duration,
    /// Longest pause between attempts to reach an unreachable server.
    #[arg(long, env = "HEDDLE_BACKOFF_CAP", default_value = "30s", value_parser = heddle_types::duration::parse)]
    pub backoff_cap: Duration,
    /// The node env file the agent keeps for Heddle's NCCL environment plugin: the node's
    /// job environment in NCCL's conf format (docs/jobs.md). The plugin reads
    /// `/var/lib/heddle-agent/nccl.env` unless jobs set `HEDDLE_NCCL_ENV_FILE` too. Default:
    /// `nccl.env` in the state directory, which is that path with the default state
    /// directory.
    #[arg(long, env = "HEDDLE_NCCL_ENV_FILE")]
    pub nccl_env_file: Option<PathBuf>,
    /// Absolute path of Heddle's NCCL profiler plugin (`libnccl-profiler-heddle.so`) on this
    /// node: written to the node env file as `NCCL_PROFILER_PLUGIN`, so every NCCL job on
    /// the node loads it. Only a path ending in `/libnccl-profiler-heddle.so` is accepted.
    #[arg(long, env = "HEDDLE_NCCL_PROFILER_PLUGIN", value_parser = profiler_path)]
    pub nccl_profiler_plugin: Option<String>,
    /// Where the agent keeps the plugins it compiles for the node's GPU map, which it writes
    /// beside the node env file (`gpu-map.json`, read by the Slurm task prolog) whenever the
    /// facts change. Default: `plugin-cache` in the state directory. Its own variable, not
    /// the server's `HEDDLE_PLUGIN_CACHE_DIR`, so one environment never points both at
    /// one directory by accident.
    #[arg(long, env = "HEDDLE_AGENT_PLUGIN_CACHE_DIR")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Host conf files kept in line with the node's environment (`/etc/nccl.conf`,
    /// `/etc/ucx/ucx.conf`).
    #[command(flatten)]
    pub host_conf: crate::host_conf::HostConfConfig,
    /// Silence (no row, no progress) a test may keep beyond the slowest step it declared
    /// before it is stopped as `hung` and its GPUs freed. Ranks whose settings disagree
    /// wait for each other forever without a word; this is how such a run ends. A run's
    /// `stall_s` overrides it.
    #[arg(long, env = "HEDDLE_STALL_LIMIT", default_value = "60s", value_parser = heddle_types::duration::parse)]
    pub stall_limit: Duration,
    /// Wall-clock limit of a job whose run sets no `timeout_s`.
    #[arg(long, env = "HEDDLE_JOB_TIMEOUT", default_value = "2h", value_parser = heddle_types::duration::parse)]
    pub job_timeout: Duration,
    /// Observed jobs: the profiler spool and NCCL Inspector's logs.
    #[command(flatten)]
    pub observe: observe::ObserveArgs,
}

fn profiler_path(s: &str) -> Result<String, String> {
    heddle_types::nccl_conf::check_profiler_path(s).map(|()| s.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error(
        "the server refused this agent's credential ({0}). The agent was revoked or \
         replaced; to enroll again remove {1} and start with a new enrollment token"
    )]
    Revoked(String, PathBuf),
    #[error("the server refused the enrollment token: {0}")]
    EnrollRefused(String),
    #[error(
        "no credential in {0} and no enrollment token: pass --enroll-token or set \
         HEDDLE_ENROLL_TOKEN"
    )]
    NoToken(PathBuf),
    #[error("enrollment failed: {0}")]
    Enroll(ClientError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

impl LifecycleError {
    /// The agent's exit status for this error (`crate::exit`).
    pub fn exit_code(&self) -> u8 {
        match self {
            LifecycleError::Revoked(..) | LifecycleError::EnrollRefused(_) => crate::exit::REFUSED,
            _ => crate::exit::WRONG,
        }
    }
}

/// Settings the loops read; fixed at start.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub claim_interval: Duration,
    pub facts_interval: Duration,
    pub facts_root: PathBuf,
    pub backoff_cap: Duration,
    pub max_parallel: u32,
    /// The binary re-executed with `child` to run a test: this agent's own.
    pub child_program: PathBuf,
    pub node_env: node_env::NodeEnvConfig,
    /// Host conf files kept in line with the node env file (`/etc/nccl.conf`, `ucx.conf`).
    pub host_conf: crate::host_conf::HostConfConfig,
    pub stall_limit: Duration,
    pub job_timeout: Duration,
}

/// Control of one job in progress.
struct JobHandle {
    stop: watch::Sender<Option<StopReason>>,
    /// Asks the job's renewal loop to ask the server now (after a heartbeat named it).
    check: Arc<Notify>,
}

/// State shared by the loops.
pub(crate) struct Agent {
    pub client: Client,
    pub spool: Spool,
    /// Results the spool refused, until it takes them or the server has them.
    pub(crate) held: held::Held,
    pub hostname: String,
    pub cfg: Config,
    pub identity_path: PathBuf,
    jobs: Mutex<HashMap<Uuid, JobHandle>>,
    heartbeat_interval_s: AtomicU32,
    /// Something was spooled.
    pub upload_wake: Notify,
    /// A heartbeat reached the server after failures: loops waiting out a backoff go now.
    pub server_back: Notify,
    /// The server asked for facts.
    pub facts_wake: Notify,
    /// Hash of the facts the server last accepted, reported in heartbeats.
    pub facts_sha: Mutex<Option<String>>,
    /// The job environment version the last heartbeat named (`node_env.rs` follows it).
    pub job_env_wanted: watch::Sender<Option<String>>,
    /// The node's clock offset to the server's, from the last heartbeat that carried the
    /// server's time (uploaded with observations).
    pub clock: Mutex<Option<heddle_types::observed::ClockOffset>>,
    fatal: mpsc::UnboundedSender<LifecycleError>,
}

impl Agent {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_secs(u64::from(
            self.heartbeat_interval_s.load(Ordering::Relaxed).max(1),
        ))
    }

    pub fn set_heartbeat_interval(&self, secs: u32) {
        self.heartbeat_interval_s
            .store(secs.max(1), Ordering::Relaxed);
    }

    pub fn running_jobs(&self) -> Vec<Uuid> {
        let mut ids: Vec<Uuid> = self
            .jobs
            .lock()
            .expect("jobs lock")
            .keys()
            .copied()
            .collect();
        ids.sort();
        ids
    }

    /// The jobs a heartbeat names, so the server renews their leases: those running, and
    /// those finished whose results wait in the spool (or in memory) for the server to
    /// store them. A result that waits out an outage, and then a backoff longer than the
    /// fresh lease term the server grants when its database returns, must not lose its
    /// job to a requeue meanwhile. Running jobs first; at most the server's 1,024.
    pub fn held_jobs(&self) -> Vec<Uuid> {
        let mut ids = self.running_jobs();
        let mut waiting: Vec<Uuid> = self
            .spool
            .list()
            .unwrap_or_default()
            .iter()
            .filter_map(SpoolId::job_id)
            .chain(self.held.job_ids())
            .filter(|id| !ids.contains(id))
            .collect();
        waiting.sort();
        waiting.dedup();
        ids.extend(waiting);
        ids.truncate(MAX_HEARTBEAT_JOBS);
        ids
    }

    /// Registers a claimed job; returns what its task listens to.
    fn register_job(&self, id: Uuid) -> (watch::Receiver<Option<StopReason>>, Arc<Notify>) {
        let (stop, rx) = watch::channel(None);
        let check = Arc::new(Notify::new());
        self.jobs.lock().expect("jobs lock").insert(
            id,
            JobHandle {
                stop,
                check: check.clone(),
            },
        );
        (rx, check)
    }

    fn unregister_job(&self, id: Uuid) {
        self.jobs.lock().expect("jobs lock").remove(&id);
    }

    pub fn stop_job(&self, id: Uuid, reason: StopReason) {
        if let Some(h) = self.jobs.lock().expect("jobs lock").get(&id) {
            h.stop.send_if_modified(|cur| {
                let first = cur.is_none();
                if first {
                    *cur = Some(reason);
                }
                first
            });
        }
    }

    /// The server says this job should stop; its renewal will learn whether it was
    /// cancelled (upload `cancelled`) or went to another agent (upload nothing).
    pub fn check_job(&self, id: Uuid) {
        if let Some(h) = self.jobs.lock().expect("jobs lock").get(&id) {
            h.check.notify_one();
        }
    }

    fn stop_all(&self, reason: StopReason) {
        for id in self.running_jobs() {
            self.stop_job(id, reason);
        }
    }

    /// Ends the agent: a task that cannot go on reports here.
    pub fn fatal(&self, err: LifecycleError) {
        let _ = self.fatal.send(err);
    }

    pub fn revoked(&self, message: String) -> LifecycleError {
        LifecycleError::Revoked(message, self.identity_path.clone())
    }
}

/// `heddle-agent run`.
/// The older name of `HEDDLE_URL`, still read by `run`.
pub const SERVER_ENV_ALIAS: &str = "HEDDLE_SERVER";

/// `--server`/`HEDDLE_URL`, else `HEDDLE_SERVER`, split at commas.
pub fn server_urls(given: Vec<String>, alias: Option<String>) -> anyhow::Result<Vec<String>> {
    let urls: Vec<String> = if given.is_empty() {
        alias
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect()
    } else {
        given
    };
    anyhow::ensure!(
        !urls.is_empty(),
        "no server to talk to: pass --server http://heddle:8080 or set HEDDLE_URL"
    );
    Ok(urls)
}

pub fn command(mut args: RunArgs) -> anyhow::Result<()> {
    args.servers = server_urls(
        std::mem::take(&mut args.servers),
        std::env::var(SERVER_ENV_ALIAS).ok(),
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LifecycleError::Runtime)?;
    let result = rt.block_on(run(args));
    // Dropping the runtime drops the job tasks, whose guards kill any child still alive.
    drop(rt);
    match result {
        Ok(()) => Ok(()),
        Err(err) => {
            tracing::error!("{err}");
            let code = err.exit_code();
            Err(crate::exit::Exit::new(code, err.to_string()).into())
        }
    }
}

pub async fn run(args: RunArgs) -> Result<(), LifecycleError> {
    let state = StateDir::open(&args.state_dir)?;
    let client = Client::with_tls(&args.servers, args.tls.clone())?;
    let hostname = args.hostname.clone().unwrap_or_else(kernel_hostname);
    let identity = match state.load_identity()? {
        Some(id) => {
            tracing::info!(agent_id = %id.agent_id, node_id = %id.node_id, "using the stored credential");
            id
        }
        None => {
            // A restart while waiting for approval asks again with the stored ticket, for
            // which the token (already spent) is not needed.
            let token = match (&args.enroll_token, state.load_pending()) {
                (Some(t), _) => t.clone(),
                (None, Some(_)) => String::new(),
                (None, None) => return Err(LifecycleError::NoToken(state.path().to_path_buf())),
            };
            let id = enroll(&client, &state, &token, &hostname, args.backoff_cap).await?;
            state.save_identity(&id)?;
            tracing::info!(agent_id = %id.agent_id, node_id = %id.node_id, path = %state.identity_path().display(), "enrolled; credential stored");
            id
        }
    };
    client.set_credential(identity.credential.clone());
    let spool = Spool::open(state.spool_dir())?;
    let child_program = std::env::current_exe().map_err(|source| StateError::Io {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let agent = Arc::new(Agent {
        client,
        spool,
        held: held::Held::default(),
        hostname,
        cfg: Config {
            claim_interval: args.claim_interval,
            facts_interval: args.facts_interval,
            facts_root: args.facts_root.clone(),
            backoff_cap: args.backoff_cap,
            max_parallel: args.max_parallel,
            child_program,
            node_env: node_env::NodeEnvConfig {
                path: args
                    .nccl_env_file
                    .clone()
                    .unwrap_or_else(|| state.path().join("nccl.env")),
                profiler: args.nccl_profiler_plugin.clone(),
                plugin_cache: args
                    .plugin_cache_dir
                    .clone()
                    .unwrap_or_else(|| state.path().join("plugin-cache")),
            },
            host_conf: args.host_conf.clone(),
            stall_limit: args.stall_limit,
            job_timeout: args.job_timeout,
        },
        identity_path: state.identity_path(),
        jobs: Mutex::new(HashMap::new()),
        heartbeat_interval_s: AtomicU32::new(10),
        upload_wake: Notify::new(),
        server_back: Notify::new(),
        facts_wake: Notify::new(),
        facts_sha: Mutex::new(None),
        job_env_wanted: watch::channel(None).0,
        clock: Mutex::new(None),
        fatal: fatal_tx,
    });
    tracing::info!(servers = ?args.servers, max_parallel = args.max_parallel, "agent running");

    let (drained_tx, drained_rx) = watch::channel(false);
    let outcome = tokio::select! {
        r = upload::run(agent.clone(), drained_tx) => r.map(|_| ()),
        r = report::heartbeat_loop(agent.clone()) => r.map(|_| ()),
        r = report::facts_loop(agent.clone()) => r.map(|_| ()),
        r = node_env::node_env_loop(agent.clone()) => r.map(|_| ()),
        r = job::claim_loop(agent.clone(), drained_rx) => r.map(|_| ()),
        r = observe::run(agent.clone(), args.observe.clone(), state.path().join("observations")) => r.map(|_| ()),
        Some(err) = fatal_rx.recv() => Err(err),
        signal = shutdown_signal() => {
            tracing::info!(signal, "shutting down; running jobs are abandoned and will be requeued");
            Ok(())
        }
    };
    agent.stop_all(StopReason::Shutdown);
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    while !agent.running_jobs().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if outcome.is_ok()
        && tokio::time::timeout_at(deadline, upload::drain(&agent))
            .await
            .is_err()
    {
        tracing::warn!(dir = %agent.spool.dir().display(), "results left in the spool; they go out at the next start");
    }
    if !agent.held.is_empty() {
        tracing::error!(
            held = agent.held.len(),
            "results the disk refused are lost with this process: neither spooled nor uploaded"
        );
    }
    drop(state);
    outcome
}

/// Enrolls, waiting for an admin's approval when the server holds the enrollment (the host
/// name has a live agent): the ticket is kept in the state directory and the server asked
/// again until it answers with a credential or a refusal.
async fn enroll(
    client: &Client,
    state: &StateDir,
    token: &str,
    hostname: &str,
    cap: Duration,
) -> Result<Identity, LifecycleError> {
    let mut ticket = state
        .load_pending()
        .filter(|p| p.hostname == hostname)
        .map(|p| p.ticket);
    let mut backoff = Backoff::new(Duration::from_millis(500), cap);
    loop {
        let req = EnrollRequest {
            enroll_token: token.to_string(),
            hostname: hostname.to_string(),
            agent_version: Some(AGENT_VERSION.to_string()),
            pending_ticket: ticket.clone(),
        };
        match client.enroll(&req).await {
            Ok(EnrollOutcome::Enrolled(resp)) => {
                state.clear_pending()?;
                return Ok(Identity {
                    agent_id: resp.agent_id,
                    node_id: resp.node_id,
                    credential: resp.credential,
                    hostname: hostname.to_string(),
                    enrolled_at: Utc::now(),
                });
            }
            Ok(EnrollOutcome::Pending(pending)) => {
                backoff.reset();
                if ticket.as_deref() != Some(pending.ticket.as_str()) {
                    state.save_pending(&PendingTicket {
                        pending_id: pending.pending_id,
                        hostname: hostname.to_string(),
                        ticket: pending.ticket.clone(),
                    })?;
                    ticket = Some(pending.ticket);
                    tracing::warn!(pending_id = %pending.pending_id, "{}", pending.message);
                    eprintln!("heddle-agent: {}", pending.message);
                } else {
                    tracing::info!(pending_id = %pending.pending_id, "still waiting for approval");
                }
                let wait = u64::from(pending.retry_after_s.clamp(1, 300));
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
            Err(ClientError::Unauthorized { message }) => {
                if ticket.is_some() {
                    state.clear_pending()?;
                }
                return Err(LifecycleError::EnrollRefused(message));
            }
            Err(err) if err.is_transient() => {
                let delay = backoff.next_delay();
                tracing::warn!(error = %err, retry_in = ?delay, attempt = backoff.failures(), "cannot enroll yet");
                tokio::time::sleep(delay).await;
            }
            Err(err) => return Err(LifecycleError::Enroll(err)),
        }
    }
}

fn kernel_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for SIGTERM/SIGINT");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heddle_url_wins_and_heddle_server_is_the_fallback() {
        let given = vec!["http://a:8080".to_string()];
        let alias = Some("http://old:8080".to_string());
        assert_eq!(
            server_urls(given, alias.clone()).unwrap(),
            ["http://a:8080"]
        );
        assert_eq!(
            server_urls(vec![], Some("http://b:8080, http://c:8080".into())).unwrap(),
            ["http://b:8080", "http://c:8080"]
        );
        let err = server_urls(vec![], None).unwrap_err().to_string();
        assert!(err.contains("HEDDLE_URL"), "{err}");
        assert!(server_urls(vec![], Some(" , ".into())).is_err());
    }

    #[test]
    fn args_accept_comma_separated_servers() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            run: RunArgs,
        }
        let t = T::try_parse_from([
            "x",
            "--server",
            "http://a:1,http://b:2",
            "--server",
            "http://c:3",
            "--state-dir",
            "/tmp/s",
        ])
        .unwrap();
        assert_eq!(
            t.run.servers,
            vec!["http://a:1", "http://b:2", "http://c:3"]
        );
        assert_eq!(t.run.max_parallel, 1);
        assert_eq!(t.run.claim_interval, Duration::from_secs(5));
    }
}
