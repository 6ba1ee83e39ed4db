//! What Heddle's NCCL profiler plugin (`libnccl-profiler-heddle.so`) records about a job it
//! runs inside, as written to the node's spool directory and read by the agent.
//!
//! One file per process, rewritten in place (temp + rename) every few seconds and at
//! finalize; the latest `seq` wins. Everything here is aggregated in the process: per
//! communicator, per collective or point-to-point function and size band, counts, bytes
//! and time, never one record per operation. A job user writes these files and the root
//! agent reads them, so [`SpoolFile::check`] bounds every list and string before anything
//! else looks at the content.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub mod progress;
pub use progress::{Completion, InFlight, Progress};

/// Version of the spool file layout; the agent refuses others.
pub const SPOOL_FORMAT: u32 = 1;
/// Largest spool file the agent reads. The plugin drops whole communicators (counted in
/// `dropped_comms`) rather than write a larger one.
pub const MAX_SPOOL_FILE_LEN: usize = 4 * 1024 * 1024;
/// Most communicators kept per process (further ones are counted in `dropped_comms`).
pub const MAX_COMMS: usize = 64;
/// Most (function, size band) rows per communicator.
pub const MAX_BANDS_PER_COMM: usize = 256;
/// Longest string the file may hold (names, ids, versions).
pub const MAX_TEXT_LEN: usize = 256;

/// What identifies the job on this node. Taken by the plugin from its own process: the
/// scheduler's variables when present, else only the process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobIdentity {
    pub pid: u32,
    /// The process's real uid; the agent refuses a file whose owner differs.
    pub uid: u32,
    /// The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22),
    /// so a reused pid is a different job.
    pub start_ticks: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_step_id: Option<String>,
    /// From the Kubernetes downward API variables, when the pod exposes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k8s_pod: Option<String>,
    /// torchrun's `TORCHELASTIC_RUN_ID`, the same in every worker it started: how a
    /// job launched without a scheduler (`torchrun --standalone`) is one job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torchrun_run_id: Option<String>,
    /// The program (`/proc/self/comm`), for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
}

/// The network that carried a communicator's proxy (inter-node) traffic, from the network
/// plugin's events: `IB` (InfiniBand or RoCE verbs), `Socket`, or another net plugin's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NetUse {
    pub net: String,
    /// Network plugin events, or proxy operations when `inferred`.
    pub ops: u64,
    /// Bytes the events reported sent (IB: RDMA writes; sockets: sends); 0 when inferred.
    pub bytes: u64,
    /// No network events came (NCCL builds without `NET_PROFILER=1`, NVIDIA's packages
    /// among them, report none for their own IB and socket transports), so the plugin
    /// named the network from the process: `NCCL_NET`, else an external net plugin
    /// (`NCCL_NET_PLUGIN`), else `IB` when the process holds RDMA devices open and IB is
    /// not disabled, else `Socket`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inferred: bool,
}

/// One collective or point-to-point function in one size band of one communicator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OpBand {
    /// NCCL's name for it: `AllReduce`, `AllGather`, `ReduceScatter`, `Broadcast`,
    /// `Reduce`, `Send`, `Recv`, ...
    pub func: String,
    /// floor(log2(bytes)) of each operation's size; 0 for 0 or 1 byte.
    pub size_band: u32,
    pub ops: u64,
    /// Sum of count × datatype size over the operations (what the caller asked to move).
    pub bytes: u64,
    /// Sum of each operation's time from its start to its stop event. NCCL stops a
    /// collective's event once it has handed the work to the GPU and the proxy, so this is
    /// host time to launch, not the transfer; `exec_ns` is the transfer.
    pub time_ns: u64,
    /// Operations whose GPU execution was timed (every channel's kernel events came).
    #[serde(default)]
    pub exec_ops: u64,
    /// Bytes of those operations: `exec_bytes / exec_ns` is their algorithm bandwidth.
    #[serde(default)]
    pub exec_bytes: u64,
    /// Sum of their GPU execution times: from the first channel's start to the last
    /// channel's stop, on the GPU's global timer.
    #[serde(default)]
    pub exec_ns: u64,
    /// Operations per algorithm (`Ring`, `Tree`, `NVLS`, ...).
    #[serde(default)]
    pub algos: BTreeMap<String, u64>,
    /// Operations per protocol (`LL`, `LL128`, `Simple`).
    #[serde(default)]
    pub protos: BTreeMap<String, u64>,
    #[serde(default)]
    pub max_channels: u32,
}

impl OpBand {
    /// The bytes and nanoseconds a bandwidth is computed from: the operations whose GPU
    /// execution was timed (`exec_*`: NCCL's kernel events, or NCCL Inspector's own
    /// execution time). `(0, 0)` when none was: `time_ns` (start to stop event) covers
    /// only the launch on the host, so bytes over it are no bandwidth at all (a 128 MiB
    /// all-reduce over sockets "ran" at thousands of GB/s by it).
    pub fn timed(&self) -> (u64, u64) {
        if self.exec_ops > 0 && self.exec_ns > 0 {
            (self.exec_bytes, self.exec_ns)
        } else {
            (0, 0)
        }
    }
}

/// One communicator as seen from this process's rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CommObservation {
    /// NCCL's communicator hash, hex.
    pub comm_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub nranks: u32,
    pub nnodes: u32,
    pub rank: u32,
    pub ops: Vec<OpBand>,
    /// Empty when no proxy traffic was seen (intra-node only, or net events not reported).
    #[serde(default)]
    pub net: Vec<NetUse>,
    /// Proxy operations seen. With `net` empty and this above 0 the communicator used a
    /// proxied transport whose network plugin reports no events.
    #[serde(default)]
    pub proxy_ops: u64,
    /// Operations not counted because all `MAX_BANDS_PER_COMM` rows were taken.
    #[serde(default)]
    pub dropped_events: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalized_at: Option<DateTime<Utc>>,
    /// How far this rank got (plugins from 0.2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

/// One process's spool file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SpoolFile {
    pub format: u32,
    pub job: JobIdentity,
    /// Rewrites of this process's file so far; the agent keeps the highest.
    pub seq: u64,
    /// The process finished with NCCL (every communicator finalized) when this was written.
    #[serde(rename = "final")]
    pub is_final: bool,
    pub written_at: DateTime<Utc>,
    pub plugin_version: String,
    /// The NCCL version the plugin was loaded by, when it could tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_version: Option<String>,
    /// The content hash (SHA-256, hex) of the Heddle env file that Heddle's environment
    /// plugin applied in this process (its `heddle_nccl_env_applied` symbol), else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_applied: Option<String>,
    pub comms: Vec<CommObservation>,
    /// Events the plugin could not record (its fixed slots were full).
    #[serde(default)]
    pub dropped_events: u64,
    #[serde(default)]
    pub dropped_comms: u64,
}

/// Why a spool file's content was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolError(pub String);

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpoolError {}

impl SpoolFile {
    /// Parses and bounds a spool file's bytes. Every string must be short and free of
    /// control characters, every list within its limit, the layout version known.
    pub fn parse(bytes: &[u8]) -> Result<SpoolFile, SpoolError> {
        if bytes.len() > MAX_SPOOL_FILE_LEN {
            return Err(SpoolError(format!(
                "{} bytes; at most {MAX_SPOOL_FILE_LEN} are read",
                bytes.len()
            )));
        }
        let file: SpoolFile = serde_json::from_slice(bytes)
            .map_err(|e| SpoolError(format!("not a spool file: {e}")))?;
        file.check()?;
        Ok(file)
    }

    /// The bounds [`SpoolFile::parse`] applies, for a value built some other way.
    pub fn check(&self) -> Result<(), SpoolError> {
        if self.format != SPOOL_FORMAT {
            return Err(SpoolError(format!(
                "layout {} is not {SPOOL_FORMAT}",
                self.format
            )));
        }
        if self.comms.len() > MAX_COMMS {
            return Err(SpoolError(format!("more than {MAX_COMMS} communicators")));
        }
        let j = &self.job;
        for (what, text) in [
            ("plugin_version", Some(&self.plugin_version)),
            ("nccl_version", self.nccl_version.as_ref()),
            ("env_applied", self.env_applied.as_ref()),
            ("slurm_job_id", j.slurm_job_id.as_ref()),
            ("slurm_step_id", j.slurm_step_id.as_ref()),
            ("k8s_namespace", j.k8s_namespace.as_ref()),
            ("k8s_pod", j.k8s_pod.as_ref()),
            ("torchrun_run_id", j.torchrun_run_id.as_ref()),
            ("comm", j.comm.as_ref()),
        ] {
            if let Some(t) = text {
                check_text(what, t)?;
            }
        }
        for c in &self.comms {
            check_text("comm_hash", &c.comm_hash)?;
            if let Some(n) = &c.name {
                check_text("name", n)?;
            }
            if c.ops.len() > MAX_BANDS_PER_COMM {
                return Err(SpoolError(format!(
                    "communicator {} has more than {MAX_BANDS_PER_COMM} rows",
                    c.comm_hash
                )));
            }
            if c.net.len() > 16 || c.rank >= c.nranks.max(1) {
                return Err(SpoolError(format!(
                    "communicator {}: rank {} of {}, {} networks",
                    c.comm_hash,
                    c.rank,
                    c.nranks,
                    c.net.len()
                )));
            }
            for b in &c.ops {
                check_text("func", &b.func)?;
                if b.size_band > 63
                    || b.algos.len() > 16
                    || b.protos.len() > 16
                    || b.exec_ops > b.ops
                    || b.exec_bytes > b.bytes
                {
                    return Err(SpoolError(format!("row {} out of range", b.func)));
                }
                for k in b.algos.keys().chain(b.protos.keys()) {
                    check_text("algorithm or protocol", k)?;
                }
            }
            for n in &c.net {
                check_text("net", &n.net)?;
            }
            if let Some(p) = &c.progress {
                p.check()?;
            }
        }
        Ok(())
    }
}

fn check_text(what: &str, text: &str) -> Result<(), SpoolError> {
    if text.len() > MAX_TEXT_LEN || text.chars().any(crate::env_policy::is_hidden) {
        return Err(SpoolError(format!(
            "{what} is longer than {MAX_TEXT_LEN} bytes or holds a control character or an \
             invisible or direction-changing one"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SpoolFile {
        SpoolFile {
            format: SPOOL_FORMAT,
            job: JobIdentity {
                pid: 4242,
                uid: 1000,
                start_ticks: 123456,
                slurm_job_id: Some("77".into()),
                slurm_step_id: Some("0".into()),
                k8s_namespace: None,
                k8s_pod: None,
                torchrun_run_id: None,
                comm: Some("python3".into()),
            },
            seq: 3,
            is_final: false,
            written_at: "2026-11-27T12:00:00Z".parse().unwrap(),
            plugin_version: "0.1.0".into(),
            nccl_version: Some("2.28.9".into()),
            env_applied: None,
            comms: vec![CommObservation {
                comm_hash: "9f3a2b".into(),
                name: None,
                nranks: 2,
                nnodes: 1,
                rank: 0,
                ops: vec![OpBand {
                    func: "AllReduce".into(),
                    size_band: 30,
                    ops: 20,
                    bytes: 20 << 30,
                    time_ns: 90_000_000,
                    exec_ops: 20,
                    exec_bytes: 20 << 30,
                    exec_ns: 480_000_000,
                    algos: [("Ring".to_string(), 20)].into(),
                    protos: [("Simple".to_string(), 20)].into(),
                    max_channels: 16,
                }],
                net: vec![],
                proxy_ops: 0,
                dropped_events: 0,
                finalized_at: None,
                progress: None,
            }],
            dropped_events: 0,
            dropped_comms: 0,
        }
    }

    #[test]
    fn round_trips_and_bounds() {
        let s = sample();
        let bytes = serde_json::to_vec(&s).unwrap();
        assert_eq!(SpoolFile::parse(&bytes).unwrap(), s);
        let mut bad = s.clone();
        bad.job.comm = Some("a\u{1b}[2J".into());
        assert!(SpoolFile::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        let mut bad = s.clone();
        bad.format = 2;
        assert!(SpoolFile::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        let mut bad = s.clone();
        bad.comms[0].ops[0].exec_ops = 21;
        assert!(SpoolFile::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        let mut bad = s;
        bad.comms[0].rank = 2;
        assert!(SpoolFile::parse(&serde_json::to_vec(&bad).unwrap()).is_err());
        assert!(SpoolFile::parse(b"{\"format\":1").is_err());
    }
}
