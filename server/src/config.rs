//! Server configuration: every knob is a flag and a `HEDDLE_*` environment variable.

mod k8s_admission;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use k8s_admission::AdmissionConfig;

#[derive(Debug, Clone, clap::Parser)]
#[command(name = "heddle-server", version, about = "Heddle control-plane server")]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "HEDDLE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Certificate chain (PEM, leaf first) to serve HTTPS with; needs --tls-key. Without
    /// both, the server speaks plain HTTP (fine on loopback or behind a TLS-terminating
    /// proxy). Both files are reloaded when they change.
    #[arg(
        long,
        env = "HEDDLE_TLS_CERT",
        requires = "tls_key",
        value_name = "FILE"
    )]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM: PKCS#8, RSA or SEC1) of --tls-cert.
    #[arg(
        long,
        env = "HEDDLE_TLS_KEY",
        requires = "tls_cert",
        value_name = "FILE"
    )]
    pub tls_key: Option<PathBuf>,

    /// Seconds between checks of the TLS files for a renewed certificate.
    #[arg(long, env = "HEDDLE_TLS_RELOAD_INTERVAL_S", default_value_t = 10)]
    pub tls_reload_interval_s: u32,

    /// Postgres URL. Migrations are applied at start-up. To require TLS add
    /// `sslmode=verify-full&sslrootcert=/path/ca.pem` (docs/security.md).
    #[arg(long, env = "HEDDLE_DATABASE_URL")]
    pub database_url: String,

    /// Largest number of Postgres connections this replica opens for everything but the
    /// agents' hot requests.
    #[arg(long, env = "HEDDLE_DB_MAX_CONNECTIONS", default_value_t = 20)]
    pub db_max_connections: u32,

    /// Postgres connections kept apart for agents' heartbeats, claims and lease renewals
    /// (and their credential look-ups), so that they never wait for a connection behind
    /// result uploads, pages or reports. Each is a short statement outside any
    /// transaction; this many of them run at once.
    #[arg(long, env = "HEDDLE_DB_AGENT_CONNECTIONS", default_value_t = 8)]
    pub db_agent_connections: u32,

    /// Seconds between agent heartbeats. A job whose agent stops heartbeating is requeued
    /// (or failed after its last attempt) within two of these intervals.
    #[arg(long, env = "HEDDLE_HEARTBEAT_INTERVAL_S", default_value_t = 10)]
    pub heartbeat_interval_s: u32,

    /// Milliseconds between writes of the heartbeats this replica received: they are kept
    /// in memory and written in one batch (agents, nodes and the leases of their running
    /// jobs) per interval, at most a quarter of the heartbeat interval. A replica that dies
    /// loses at most this much liveness; leases get this long on top of their length.
    #[arg(long, env = "HEDDLE_HEARTBEAT_FLUSH_MS", default_value_t = 2000)]
    pub heartbeat_flush_ms: u64,

    /// Milliseconds within which a revoked agent credential stops working on every
    /// replica. A credential Postgres accepted is then trusted from memory, and each replica
    /// reads the log of revocations every half this interval; when it cannot, it checks
    /// every credential in Postgres again. 0: every request checks Postgres.
    #[arg(long, env = "HEDDLE_REVOCATION_DELAY_MS", default_value_t = 2000)]
    pub revocation_delay_ms: u64,

    /// Changes of a node's facts kept in its history (`heddle nodes history`); older ones
    /// are dropped when a new change is stored.
    #[arg(long, env = "HEDDLE_FACTS_HISTORY_KEEP", default_value_t = 100)]
    pub facts_history_keep: u32,

    /// Observed jobs kept per node (`heddle jobs ls`); the node's least recently seen ones
    /// are dropped when a new one is stored, as facts history is.
    #[arg(long, env = "HEDDLE_OBSERVED_JOBS_KEEP", default_value_t = 200)]
    pub observed_jobs_keep: u32,

    /// An observed job's large-message bus bandwidth more than this fraction below the
    /// node's own latest test figure for that collective warns (`job-below-expected`).
    /// Jobs overlap compute with communication, so the default is looser than a test's 5 %.
    #[arg(
        long,
        env = "HEDDLE_JOB_BELOW_EXPECTED_FRACTION",
        default_value_t = 0.25
    )]
    pub job_below_expected_fraction: f64,

    /// Seconds in which no rank of an observed job started an operation while some wait in
    /// a collective, before the job is hung (`job-hung`). With the profiler's prompt write
    /// (3 s) and the agent's rescan (1 s), a hung job is named within about 20 s of its
    /// last progress by default.
    #[arg(long, env = "HEDDLE_JOB_HUNG_S", default_value_t = 15.0)]
    pub job_hung_s: f64,

    /// Seconds without a report from a rank of a running observed job before it counts as
    /// gone (`job-rank-silent`, or a culprit of `job-hung`).
    #[arg(long, env = "HEDDLE_JOB_SILENT_S", default_value_t = 30.0)]
    pub job_silent_s: f64,

    /// Median lateness (ms after the first rank) of the rank last at most collectives
    /// before it is a straggler (`job-straggler`).
    #[arg(long, env = "HEDDLE_JOB_STRAGGLER_MS", default_value_t = 50.0)]
    pub job_straggler_ms: f64,

    /// Days full history is kept: results with their rows, verdicts and series points.
    /// Whole months are dropped once their last day is this old (docs/health.md, "History"),
    /// so rows live this long and up to a month more. Each node's latest verdict per test,
    /// change points and the daily rollups stay. 0 keeps everything.
    #[arg(long, env = "HEDDLE_HISTORY_KEEP_DAYS", default_value_t = HistoryKeep::DEFAULT.raw_days)]
    pub history_keep_days: u32,

    /// Days series' daily rollups (what charts longer than 30 days read) are kept, by whole
    /// months as above. 0 keeps them forever.
    #[arg(long, env = "HEDDLE_ROLLUP_KEEP_DAYS", default_value_t = HistoryKeep::DEFAULT.rollup_days)]
    pub rollup_keep_days: u32,

    /// Seconds between runs of the history maintenance: monthly partitions created three
    /// months ahead, expired months dropped.
    #[arg(long, env = "HEDDLE_HISTORY_INTERVAL_S", default_value_t = 3600)]
    pub history_interval_s: u64,

    /// How much an open regression (a figure that moved for the worse and stayed; docs/
    /// health.md, "Regressions") weighs in its node's health: `info` (listed only), `warn`
    /// or `fail`.
    #[arg(long, env = "HEDDLE_REGRESSION_SEVERITY", default_value = "warn",
        value_parser = ["info", "warn", "fail"])]
    pub regression_severity: String,

    /// Admin token to create at start-up if no token with this value exists (instead of a
    /// random one printed on first start).
    #[arg(long, env = "HEDDLE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Largest request body accepted by JSON endpoints, in bytes.
    #[arg(long, env = "HEDDLE_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,

    /// Largest result upload (many result rows), in bytes.
    #[arg(long, env = "HEDDLE_MAX_RESULT_BYTES", default_value_t = 16 << 20)]
    pub max_result_bytes: usize,

    /// Largest plugin component accepted, in bytes. The default admits a Python plugin
    /// (componentize-py puts CPython in every component: about 18 MB).
    #[arg(long, env = "HEDDLE_MAX_PLUGIN_BYTES", default_value_t = heddle_plugin_host::Limits::default().max_component_bytes)]
    pub max_plugin_bytes: usize,

    /// Largest fabric import (`PUT /api/v1/fabric`: a topology file as a JSON string), in
    /// bytes. A Heddle fabric file of 10,000 nodes with 8 NICs each is about 8 MB.
    #[arg(long, env = "HEDDLE_MAX_FABRIC_BYTES", default_value_t = 64 << 20)]
    pub max_fabric_bytes: usize,

    /// Fuel (about one unit per WebAssembly instruction) each plugin call may burn.
    #[arg(long, env = "HEDDLE_PLUGIN_FUEL", default_value_t = 500_000_000)]
    pub plugin_fuel: u64,

    /// Wall-clock limit of one plugin call, in milliseconds.
    #[arg(long, env = "HEDDLE_PLUGIN_TIMEOUT_MS", default_value_t = 2000)]
    pub plugin_timeout_ms: u64,

    /// Largest linear memory a plugin may grow to, in bytes.
    #[arg(long, env = "HEDDLE_PLUGIN_MAX_MEMORY_BYTES", default_value_t = 64 << 20)]
    pub plugin_max_memory_bytes: usize,

    /// Longest a plugin component may take to compile, in milliseconds.
    #[arg(
        long,
        env = "HEDDLE_PLUGIN_COMPILE_TIMEOUT_MS",
        default_value_t = 60_000
    )]
    pub plugin_compile_timeout_ms: u64,

    /// Bytes of each plugin instance slot's memory kept resident between calls and reset in
    /// place (where Linux has PAGEMAP_SCAN, 6.7 and later, only the pages a call wrote)
    /// rather than handed back to the kernel and faulted in again by the next call. A Python
    /// plugin writes megabytes of CPython's heap per call; a Rust one well under 1 MiB.
    /// Costs up to this much resident memory per slot (two slots per core, plus eight).
    #[arg(long, env = "HEDDLE_PLUGIN_KEEP_RESIDENT_BYTES", default_value_t = 32 << 20)]
    pub plugin_keep_resident_bytes: usize,

    /// Private local directory (created 0700) where compiled plugins are kept across
    /// restarts, by hash of their bytes; unset compiles each plugin once per process.
    #[arg(long, env = "HEDDLE_PLUGIN_CACHE_DIR")]
    pub plugin_cache_dir: Option<PathBuf>,

    /// Milliseconds the plugin reconciler holds each claimed batch (its transaction and
    /// advisory locks open) before evaluating it, with a log line when it starts. 0 (the
    /// default) outside fault tests, which use it to break the database under a held batch.
    #[arg(
        long,
        env = "HEDDLE_RECONCILER_HOLD_MS",
        default_value_t = 0,
        hide = true
    )]
    pub reconciler_hold_ms: u64,

    /// Longest a request may take, in seconds, before it is answered 503 and dropped. Result
    /// and plugin uploads get HEDDLE_UPLOAD_TIMEOUT_S, long polls
    /// HEDDLE_LONG_POLL_TIMEOUT_S.
    #[arg(long, env = "HEDDLE_REQUEST_TIMEOUT_S", default_value_t = 30)]
    pub request_timeout_s: u64,

    /// Longest a result or plugin upload may take, in seconds.
    #[arg(long, env = "HEDDLE_UPLOAD_TIMEOUT_S", default_value_t = 120)]
    pub upload_timeout_s: u64,

    /// Longest a long poll may take, in seconds: rendezvous waits (at most 120 s) and
    /// pre-flight waits (at most 600 s) end on their own before this.
    #[arg(long, env = "HEDDLE_LONG_POLL_TIMEOUT_S", default_value_t = 630)]
    pub long_poll_timeout_s: u64,

    /// Long polls (rendezvous and pre-flight waits) this replica serves at once; the next
    /// is answered at once with 503 and Retry-After.
    #[arg(long, env = "HEDDLE_MAX_LONG_POLLS", default_value_t = 256)]
    pub max_long_polls: usize,

    /// Requests per second one credential (API token, agent credential, or the peer address
    /// of a request without one) may make to this replica, sustained; excess is answered
    /// 429 with Retry-After. 0 turns the limit off.
    #[arg(long, env = "HEDDLE_RATE_LIMIT_PER_S", default_value_t = 50)]
    pub rate_limit_per_s: u32,

    /// Requests one credential may make at once above the sustained rate.
    #[arg(long, env = "HEDDLE_RATE_LIMIT_BURST", default_value_t = 200)]
    pub rate_limit_burst: u32,

    /// Bearer token that `/metrics` requires; open to anyone who can reach it when unset.
    #[arg(long, env = "HEDDLE_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// Folder holding the built dashboard (index.html and its wasm/js); a minimal status
    /// page is served when absent.
    #[arg(long, env = "HEDDLE_DASHBOARD_DIR")]
    pub dashboard_dir: Option<PathBuf>,

    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "HEDDLE_LOG_JSON", default_value_t = false)]
    pub log_json: bool,

    /// The Kubernetes admission webhook (`--k8s-admission` and what it injects).
    #[command(flatten)]
    pub k8s_admission: AdmissionConfig,
}

impl Config {
    /// A configuration for tests and embedding: defaults everywhere but the database.
    pub fn for_database(database_url: impl Into<String>) -> Self {
        use clap::Parser;
        let mut cfg = Config::parse_from(["heddle-server", "--database-url", "unused"]);
        cfg.database_url = database_url.into();
        cfg
    }

    pub fn plugin_limits(&self) -> heddle_plugin_host::Limits {
        heddle_plugin_host::Limits {
            fuel: self.plugin_fuel,
            timeout: Duration::from_millis(self.plugin_timeout_ms.max(1)),
            max_memory_bytes: self.plugin_max_memory_bytes,
            max_component_bytes: self.max_plugin_bytes,
            max_compile_time: Duration::from_millis(self.plugin_compile_timeout_ms.max(1)),
            ..heddle_plugin_host::Limits::default()
        }
    }

    pub fn tls_reload_interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.tls_reload_interval_s.max(1)))
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_s.max(1))
    }

    pub fn upload_timeout(&self) -> Duration {
        Duration::from_secs(self.upload_timeout_s.max(1))
    }

    pub fn long_poll_timeout(&self) -> Duration {
        Duration::from_secs(self.long_poll_timeout_s.max(1))
    }

    pub fn regression_severity(&self) -> heddle_types::health::Severity {
        use heddle_types::health::Severity;
        match self.regression_severity.as_str() {
            "info" => Severity::Info,
            "fail" => Severity::Fail,
            _ => Severity::Warn,
        }
    }

    pub fn history_keep(&self) -> HistoryKeep {
        HistoryKeep {
            raw_days: self.history_keep_days,
            rollup_days: self.rollup_keep_days,
        }
    }

    pub fn history_interval(&self) -> Duration {
        Duration::from_secs(self.history_interval_s.max(1))
    }

    pub fn revocation_delay(&self) -> Duration {
        Duration::from_millis(self.revocation_delay_ms)
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.heartbeat_interval_s.max(1)))
    }

    /// How often this replica writes the heartbeats it received: HEDDLE_HEARTBEAT_FLUSH_MS,
    /// at most a quarter heartbeat (so a lease, 1.5 heartbeats long, is renewed in the
    /// database before it lapses) and at least 10 ms.
    pub fn heartbeat_flush_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_flush_ms.max(10)).min(self.heartbeat_interval() / 4)
    }

    /// How long past its recorded expiry a lease is still honoured: one flush interval, for
    /// a heartbeat that renewed it and is still waiting in some replica's memory.
    pub fn lease_margin(&self) -> Duration {
        self.heartbeat_flush_interval()
    }

    /// How long a lease lives without renewal: 1.5 heartbeats, so with the margin (at most a
    /// quarter heartbeat) and the reaper ticking every quarter heartbeat a dead agent's job
    /// is requeued within two intervals.
    pub fn lease_ttl(&self) -> Duration {
        self.heartbeat_interval() * 3 / 2
    }
}

/// How long history is kept, in days; 0 keeps it forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryKeep {
    /// Results, their rows, verdicts and series points.
    pub raw_days: u32,
    /// Series' daily rollups.
    pub rollup_days: u32,
}

impl HistoryKeep {
    /// The defaults of `HEDDLE_HISTORY_KEEP_DAYS` and `HEDDLE_ROLLUP_KEEP_DAYS`.
    pub const DEFAULT: HistoryKeep = HistoryKeep {
        raw_days: 90,
        rollup_days: 3 * 365,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bounds an operator sizes a replica by are in `--help`, with their figures.
    #[test]
    fn help_names_every_bound_with_its_default() {
        use clap::CommandFactory;
        let help = Config::command().render_long_help().to_string();
        for (env, default) in [
            ("HEDDLE_REQUEST_TIMEOUT_S", "30"),
            ("HEDDLE_UPLOAD_TIMEOUT_S", "120"),
            ("HEDDLE_LONG_POLL_TIMEOUT_S", "630"),
            ("HEDDLE_MAX_LONG_POLLS", "256"),
            ("HEDDLE_RATE_LIMIT_PER_S", "50"),
            ("HEDDLE_RATE_LIMIT_BURST", "200"),
            ("HEDDLE_HEARTBEAT_FLUSH_MS", "2000"),
            ("HEDDLE_REVOCATION_DELAY_MS", "2000"),
            ("HEDDLE_DB_MAX_CONNECTIONS", "20"),
            ("HEDDLE_HISTORY_KEEP_DAYS", "90"),
            ("HEDDLE_ROLLUP_KEEP_DAYS", "1095"),
        ] {
            let at = help
                .find(&format!("[env: {env}="))
                .unwrap_or_else(|| panic!("{env} is not in --help:\n{help}"));
            // The knob's own lines, up to the next flag.
            let rest = &help[at..];
            let own = &rest[..rest.find("\n  -").unwrap_or(rest.len())];
            assert!(
                own.contains(&format!("[default: {default}]")),
                "{env}: {own}"
            );
        }
    }

    #[test]
    fn heartbeats_are_flushed_within_a_quarter_heartbeat() {
        let mut c = Config::for_database("postgres://unused");
        assert_eq!(c.heartbeat_flush_interval(), Duration::from_secs(2));
        assert_eq!(c.lease_margin(), Duration::from_secs(2));
        c.heartbeat_interval_s = 1;
        assert_eq!(c.heartbeat_flush_interval(), Duration::from_millis(250));
        c.heartbeat_flush_ms = 0;
        assert_eq!(c.heartbeat_flush_interval(), Duration::from_millis(10));
        // A dead agent's job is requeued within two heartbeats: lease, margin, reaper tick.
        c.heartbeat_flush_ms = 60_000;
        c.heartbeat_interval_s = 10;
        let worst = c.lease_ttl() + c.lease_margin() + c.heartbeat_interval() / 4;
        assert!(worst <= c.heartbeat_interval() * 2, "{worst:?}");
    }
}
