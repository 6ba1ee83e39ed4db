//! Observed workloads (people's training and inference jobs, which Heddle watches through
//! NCCL's profiler plugin, as opposed to Heddle's own test jobs): what the agent uploads from
//! the profiler spool (or NCCL Inspector's logs) and what the server answers about the
//! workloads it saw. The spool file itself is [`crate::observe::SpoolFile`]; this module
//! holds the upload around it, the public answers, and the pure rules every component reads
//! them by (a workload's key, a size band's bandwidths, a communicator's transport). The
//! JSON keeps the words of its first version (`job_key`, reason codes `job-hung`, ...).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::health::{Reason, Verdict};
use crate::observe::{InFlight, JobIdentity, NetUse, OpBand, SpoolFile};

/// Most observations in one upload.
pub const MAX_OBSERVATIONS_PER_UPLOAD: usize = 64;
/// Operations at least this large (2^26 bytes = 64 MiB) are the "large-message" band a
/// workload's bandwidth is judged on, as test results are judged on their largest sizes.
pub const LARGE_BAND: u32 = 26;

/// Which tool wrote what the agent read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ObservationSource {
    /// Heddle's profiler plugin: bandwidth and the network per communicator.
    Profiler,
    /// NCCL Inspector's JSON logs: bandwidth only, no transport.
    Inspector,
}

impl ObservationSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ObservationSource::Profiler => "profiler",
            ObservationSource::Inspector => "inspector",
        }
    }
}

/// One process's latest state, as read from the node's spool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Observation {
    pub source: ObservationSource,
    pub file: SpoolFile,
}

/// `POST /api/v1/agent/observations`. Idempotent: the server keeps, per node, process and
/// communicator, the highest `seq` it was sent; sending the same batch twice changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ObservationUpload {
    pub observations: Vec<Observation>,
    /// How far the node's clock is from the server's, as the agent measured it on its
    /// last heartbeat: the progress times in the files are compared across nodes with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockOffset>,
}

/// The server's clock minus the node's, from one heartbeat's round trip: the server's
/// time in its answer against the middle of the agent's send and receive. Accurate to
/// within half the round trip (`error_ns`) plus how far the node's clock drifts until the
/// next heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClockOffset {
    pub offset_ns: i64,
    pub error_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ObservationsAccepted {
    /// Communicators stored or brought forward by this upload.
    pub stored: u32,
    /// Communicators the server already held at this `seq` or a later one.
    pub unchanged: u32,
    /// Communicators refused because their workload holds as many rows as the server keeps
    /// per workload (counted in `/metrics`).
    #[serde(default)]
    pub refused: u32,
}

/// One function in one size band of a communicator, with its bandwidths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BandFigure {
    /// NCCL's name (`AllReduce`, ...).
    pub func: String,
    pub size_band: u32,
    pub ops: u64,
    pub bytes: u64,
    /// Host launch time (start to stop event): never a bandwidth.
    pub time_ns: u64,
    /// Operations whose execution on the GPU was timed: the bandwidths are theirs.
    #[serde(default)]
    pub gpu_timed_ops: u64,
    /// GB/s as nccl-tests computes it (see [`bandwidths`]) from the GPU-timed operations;
    /// none for point-to-point, when no operation was timed on the GPU, or when the
    /// figure would exceed its path's limit ([`path_limit_gbs`]; `note` says which).
    pub algbw_gbs: Option<f64>,
    pub busbw_gbs: Option<f64>,
    /// Why a collective's band has no bandwidth, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl BandFigure {
    /// The figure of `band` (summed over a communicator's local ranks) on a communicator of
    /// `nranks` whose path carries at most `limit_gbs` ([`path_limit_gbs`]).
    pub fn of(band: &OpBand, nranks: u32, limit_gbs: f64) -> BandFigure {
        let (timed_bytes, timed_ns) = band.timed();
        let mut bw = bandwidths(&band.func, nranks, timed_bytes, timed_ns);
        let p2p =
            crate::collective::canonical_collective(&band.func).map_or(true, |c| c == "sendrecv");
        let note = match bw {
            _ if p2p => None,
            None => Some("no operation in this band was timed on the GPU".to_string()),
            Some((_, bus)) if bus > limit_gbs => {
                bw = None;
                Some(format!(
                    "{bus:.0} GB/s would exceed the path's limit of {limit_gbs:.0} GB/s: \
                     not a measurement"
                ))
            }
            Some(_) => None,
        };
        BandFigure {
            func: band.func.clone(),
            size_band: band.size_band,
            ops: band.ops,
            bytes: band.bytes,
            time_ns: band.time_ns,
            gpu_timed_ops: if timed_ns > 0 { band.exec_ops } else { 0 },
            algbw_gbs: bw.map(|b| b.0),
            busbw_gbs: bw.map(|b| b.1),
            note,
        }
    }
}

/// The most bus bandwidth (GB/s) a communicator's path can carry, so that no figure above
/// it is shown or judged; generous on purpose (the fastest hardware shipping, not the
/// node's): a communicator within one node (`nnodes` ≤ 1 or no network): 1,000 (NVLink 5
/// carries 900 GB/s per direction per GPU); over NCCL's socket transport: 100 (one
/// 800 Gb/s NIC, which NCCL's CPU-copied sockets come nowhere near); over another network
/// (`IB`, a net plugin): 800 (eight 800 Gb/s NICs, the most a node carries).
pub fn path_limit_gbs(transport: Option<&str>, nnodes: u32) -> f64 {
    match transport {
        Some(t) if nnodes > 1 && is_socket(t) => 100.0,
        Some(_) if nnodes > 1 => 800.0,
        _ => 1000.0,
    }
}

/// A communicator of an observed workload, merged over its processes on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ObservedComm {
    pub comm_hash: String,
    pub name: Option<String>,
    pub nranks: u32,
    pub nnodes: u32,
    /// Ranks of this communicator seen on this node.
    pub local_ranks: u32,
    /// The network that carried most of its inter-node bytes (`IB`, `Socket`, ...); none
    /// when no proxy traffic was reported (intra-node, or NCCL Inspector).
    pub transport: Option<String>,
    pub net: Vec<NetUse>,
    /// Figures of the rank with the most operations, by function then size band.
    pub bands: Vec<BandFigure>,
    pub finalized: bool,
    pub seq: u64,
    pub written_at: DateTime<Utc>,
}

/// An observed workload on one node: one row of `GET /api/v1/workloads`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkloadSummary {
    pub id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    /// What identifies the workload on the node (see [`workload_key`]).
    #[serde(rename = "job_key")]
    pub workload_key: String,
    pub source: ObservationSource,
    pub uid: u32,
    pub slurm_job_id: Option<String>,
    pub k8s_namespace: Option<String>,
    pub k8s_pod: Option<String>,
    /// The program's name, for people.
    pub comm: Option<String>,
    pub processes: u32,
    pub communicators: u32,
    /// Every process seen has finished with NCCL.
    pub finished: bool,
    /// The Heddle env file hash the workload ran with; none when a process ran without it.
    pub env_applied: Option<String>,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub verdict: Verdict,
    /// Worst first; codes `job-socket-fallback`, `job-below-expected`, `job-env-missing`.
    pub reasons: Vec<Reason>,
}

/// `GET /api/v1/workloads/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Workload {
    #[serde(flatten)]
    pub summary: WorkloadSummary,
    pub comms: Vec<ObservedComm>,
    /// Every rank of the workload's communicators on every node where it runs under the
    /// same key and owner, as last judged (culprits marked).
    #[serde(default)]
    pub ranks: Vec<RankRow>,
}

/// One rank of one communicator of an observed workload, joined across nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RankRow {
    pub comm_hash: String,
    pub rank: u32,
    pub hostname: String,
    /// Collectives started and known complete.
    pub coll_started: u64,
    pub coll_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlight>,
    /// Seconds since its last operation started, when judged; 0 when it started none.
    pub quiet_s: f64,
    /// Median lateness at the collectives every rank reported, ms after the first rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lateness_ms: Option<f64>,
    /// Seconds since the server last had a report of it.
    pub silent_s: f64,
    pub finalized: bool,
    /// Named by a `job-hung`, `job-straggler` or `job-rank-silent` reason.
    pub culprit: bool,
}

/// Whether a workload's reasons say it is hung (`job-hung`) or straggling
/// (`job-straggler`): 2, 1 or 0, so that lists put hung workloads first.
pub fn progress_rank(reasons: &[Reason]) -> u8 {
    let has = |code: &str| reasons.iter().any(|r| r.code.as_deref() == Some(code));
    if has("job-hung") {
        2
    } else if has("job-straggler") || has("job-rank-silent") {
        1
    } else {
        0
    }
}

/// The workload a process belongs to on its node: the scheduler's job (and step) when the
/// process knew it, else its pod, else the torchrun launch it is a worker of (with its
/// uid: the run id is the launcher's word, and one user's must never join another's
/// workload), else the process itself (pid and start time, so a reused pid is another
/// workload).
pub fn workload_key(id: &JobIdentity) -> String {
    match (&id.slurm_job_id, &id.k8s_namespace, &id.k8s_pod) {
        (Some(job), _, _) => match &id.slurm_step_id {
            Some(step) => format!("slurm:{job}.{step}"),
            None => format!("slurm:{job}"),
        },
        (None, Some(ns), Some(pod)) => format!("k8s:{ns}/{pod}"),
        _ => match &id.torchrun_run_id {
            Some(run) => format!("torchrun:{}:{run}", id.uid),
            None => format!("pid:{}@{}", id.pid, id.start_ticks),
        },
    }
}

/// Bytes a collective's operations moved per rank for nccl-tests' algorithm bandwidth,
/// over the bytes the caller asked for (`count × datatype size`): all-gather and
/// reduce-scatter name one rank's share, nccl-tests and NCCL Inspector count all ranks'.
fn traffic_factor(collective: &str, nranks: u32) -> f64 {
    match collective {
        "all_gather" | "reduce_scatter" => f64::from(nranks.max(1)),
        _ => 1.0,
    }
}

/// `(algbw, busbw)` in GB/s of `ops` operations of NCCL function `func` that moved `bytes`
/// (the callers' `count × datatype size`) in `time_ns`, on a communicator of `nranks`:
/// algbw = traffic / time, busbw = algbw × nccl-tests' bus factor
/// ([`crate::collective::bus_factor`]). None for point-to-point functions and empty rows.
pub fn bandwidths(func: &str, nranks: u32, bytes: u64, time_ns: u64) -> Option<(f64, f64)> {
    let coll = crate::collective::canonical_collective(func).ok()?;
    if coll == "sendrecv" || time_ns == 0 || bytes == 0 {
        return None;
    }
    // bytes per ns is GB/s.
    let algbw = bytes as f64 * traffic_factor(coll, nranks) / time_ns as f64;
    Some((algbw, algbw * crate::collective::bus_factor(coll, nranks)))
}

/// The size band of an operation of `bytes`: floor(log2(bytes)), 0 for 0 or 1 byte (as
/// the profiler plugin bands them).
pub fn band_of(bytes: u64) -> u32 {
    bytes.checked_ilog2().unwrap_or(0)
}

/// A size band as people read it: the smallest size in it (`32 MiB` for band 25).
pub fn band_label(band: u32) -> String {
    let band = band.min(63);
    match band {
        30.. => format!("{} GiB", 1u64 << (band - 30)),
        20.. => format!("{} MiB", 1u64 << (band - 20)),
        10.. => format!("{} KiB", 1u64 << (band - 10)),
        _ => format!("{} B", 1u64 << band),
    }
}

/// The network that carried most of a communicator's proxy bytes, spelled as NCCL's net
/// plugins name themselves (`IB`, `Socket`); none when none was reported.
pub fn dominant_net(net: &[NetUse]) -> Option<&str> {
    net.iter()
        .filter(|n| n.bytes > 0 || n.ops > 0)
        .max_by_key(|n| (n.bytes, n.ops))
        .map(|n| n.net.as_str())
}

/// Whether NCCL's name for a network is its socket transport.
pub fn is_socket(net: &str) -> bool {
    net.eq_ignore_ascii_case("socket")
}

impl Observation {
    /// The key the server stores this process's rows under, with the node: the workload
    /// and the process identity. Two uploads of the same process and `seq` are the same.
    pub fn process_key(&self) -> (String, u32, u64) {
        let j = &self.file.job;
        (workload_key(j), j.pid, j.start_ticks)
    }
}

/// One workload across the nodes it ran on: the per-node rows of `GET /api/v1/workloads`
/// that share a key (a Slurm job step is one key on every node), as
/// `heddle workloads ls --slurm-job` shows them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinedWorkload {
    #[serde(rename = "job_key")]
    pub workload_key: String,
    pub slurm_job_id: Option<String>,
    /// Host names, in order.
    pub nodes: Vec<String>,
    /// Processes on all nodes together (each rank is one process).
    pub processes: u32,
    /// Every node's processes have finished with NCCL.
    pub finished: bool,
    /// The nodes' verdicts combined ([`Verdict::combine`]).
    pub verdict: Verdict,
    /// The per-node rows (`GET /api/v1/workloads/{id}`), in the order of `nodes`.
    pub ids: Vec<Uuid>,
}

/// Joins per-node rows by workload key and uid (another user's workload of the same key is
/// another workload), keeping the order in which each key first appears.
pub fn join_nodes(rows: &[WorkloadSummary]) -> Vec<JoinedWorkload> {
    let mut out: Vec<(u32, JoinedWorkload, Vec<Verdict>)> = Vec::new();
    for r in rows {
        let at = match out
            .iter()
            .position(|(uid, j, _)| *uid == r.uid && j.workload_key == r.workload_key)
        {
            Some(i) => i,
            None => {
                out.push((
                    r.uid,
                    JoinedWorkload {
                        workload_key: r.workload_key.clone(),
                        slurm_job_id: r.slurm_job_id.clone(),
                        nodes: Vec::new(),
                        processes: 0,
                        finished: true,
                        verdict: Verdict::Unknown,
                        ids: Vec::new(),
                    },
                    Vec::new(),
                ));
                out.len() - 1
            }
        };
        let (_, j, verdicts) = &mut out[at];
        j.nodes.push(r.hostname.clone());
        j.ids.push(r.id);
        j.processes = j.processes.saturating_add(r.processes);
        j.finished &= r.finished;
        verdicts.push(r.verdict);
    }
    out.into_iter()
        .map(|(_, mut j, verdicts)| {
            let mut order: Vec<usize> = (0..j.nodes.len()).collect();
            order.sort_by(|a, b| j.nodes[*a].cmp(&j.nodes[*b]));
            j.ids = order.iter().map(|i| j.ids[*i]).collect();
            j.nodes = order.iter().map(|i| j.nodes[*i].clone()).collect();
            j.verdict = Verdict::combine(verdicts);
            j
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident() -> JobIdentity {
        JobIdentity {
            pid: 7,
            uid: 1000,
            start_ticks: 99,
            slurm_job_id: None,
            slurm_step_id: None,
            k8s_namespace: None,
            k8s_pod: None,
            torchrun_run_id: None,
            comm: None,
        }
    }

    #[test]
    fn workload_keys_prefer_the_scheduler() {
        let mut id = ident();
        assert_eq!(workload_key(&id), "pid:7@99");
        id.torchrun_run_id = Some("4f1c".into());
        assert_eq!(workload_key(&id), "torchrun:1000:4f1c");
        id.k8s_namespace = Some("ml".into());
        id.k8s_pod = Some("train-0".into());
        assert_eq!(workload_key(&id), "k8s:ml/train-0");
        id.slurm_job_id = Some("77".into());
        assert_eq!(workload_key(&id), "slurm:77");
        id.slurm_step_id = Some("0".into());
        assert_eq!(workload_key(&id), "slurm:77.0");
    }

    #[test]
    fn bandwidths_follow_nccl_tests() {
        // 1 GiB all-reduce in 10 ms on 8 ranks: algbw 107.37 GB/s, busbw × 2·7/8.
        let (alg, bus) = bandwidths("AllReduce", 8, 1 << 30, 10_000_000).unwrap();
        assert!((alg - 107.374).abs() < 0.01, "{alg}");
        assert!((bus - alg * 1.75).abs() < 1e-9);
        // All-gather counts every rank's share: 8 × 128 MiB in 10 ms, busbw × 7/8.
        let (alg, bus) = bandwidths("AllGather", 8, 128 << 20, 10_000_000).unwrap();
        assert!((alg - 107.374).abs() < 0.01, "{alg}");
        assert!((bus - alg * 0.875).abs() < 1e-9);
        let (alg, bus) = bandwidths("Broadcast", 8, 1 << 30, 10_000_000).unwrap();
        assert_eq!(alg, bus);
        assert!(bandwidths("Send", 2, 1 << 30, 1).is_none());
        assert!(bandwidths("AllReduce", 8, 1 << 30, 0).is_none());
        assert!(bandwidths("Mystery", 8, 1 << 30, 1).is_none());
    }

    fn band(exec_ops: u64, exec_ns: u64) -> OpBand {
        OpBand {
            func: "AllReduce".into(),
            size_band: 27,
            ops: 10,
            bytes: 10 << 27,
            // Host launch time only: 10 × 128 MiB "in" 100 µs.
            time_ns: 100_000,
            exec_ops,
            exec_bytes: exec_ops << 27,
            exec_ns,
            algos: Default::default(),
            protos: Default::default(),
            max_channels: 0,
        }
    }

    #[test]
    fn a_band_without_gpu_time_has_no_bandwidth() {
        let limit = path_limit_gbs(Some("Socket"), 2);
        let f = BandFigure::of(&band(0, 0), 2, limit);
        assert_eq!((f.algbw_gbs, f.busbw_gbs, f.gpu_timed_ops), (None, None, 0));
        assert!(f.note.unwrap().contains("timed on the GPU"));
        // Two operations timed on the GPU, 2 × 128 MiB in 180 ms: 1.49 GB/s.
        let f = BandFigure::of(&band(2, 180_000_000), 2, limit);
        assert!((f.algbw_gbs.unwrap() - 1.491).abs() < 0.01, "{f:?}");
        assert_eq!((f.gpu_timed_ops, f.note), (2, None));
    }

    #[test]
    fn no_figure_above_the_path_limit_is_given() {
        // 2 × 128 MiB in 20 µs of "GPU time" over sockets: 13,422 GB/s, not a measurement.
        let f = BandFigure::of(&band(2, 20_000), 2, path_limit_gbs(Some("Socket"), 2));
        assert_eq!((f.algbw_gbs, f.busbw_gbs), (None, None));
        assert!(f.note.unwrap().contains("limit of 100 GB/s"));
        // The same within one node is still above NVLink's 900 GB/s.
        let f = BandFigure::of(&band(2, 20_000), 2, path_limit_gbs(None, 1));
        assert_eq!(f.busbw_gbs, None);
        // 2 × 128 MiB in 1 ms within a node: 268 GB/s, shown.
        let f = BandFigure::of(&band(2, 1_000_000), 2, path_limit_gbs(None, 1));
        assert!(f.busbw_gbs.is_some());
        assert_eq!(path_limit_gbs(Some("IB"), 4), 800.0);
        // Point-to-point has no bandwidth and needs no note.
        let mut p2p = band(2, 1_000_000);
        p2p.func = "Send".into();
        assert_eq!(BandFigure::of(&p2p, 2, 100.0).note, None);
    }

    #[test]
    fn dominant_net_is_the_one_with_most_bytes() {
        let n = |net: &str, bytes| NetUse {
            net: net.into(),
            ops: 1,
            bytes,
            inferred: false,
        };
        assert_eq!(dominant_net(&[]), None);
        assert_eq!(
            dominant_net(&[n("IB", 10), n("Socket", 900)]),
            Some("Socket")
        );
        assert_eq!(dominant_net(&[n("IB", 900), n("Socket", 10)]), Some("IB"));
        assert!(is_socket("Socket") && !is_socket("IB"));
    }

    #[test]
    fn a_job_step_on_two_nodes_is_one_workload() {
        let row = |host: &str, key: &str, uid: u32, procs: u32, finished: bool, verdict| {
            WorkloadSummary {
                id: Uuid::new_v4(),
                node_id: Uuid::new_v4(),
                hostname: host.into(),
                workload_key: key.into(),
                source: ObservationSource::Profiler,
                uid,
                slurm_job_id: Some("9".into()),
                k8s_namespace: None,
                k8s_pod: None,
                comm: None,
                processes: procs,
                communicators: 1,
                finished,
                env_applied: None,
                first_seen_at: Utc::now(),
                last_seen_at: Utc::now(),
                verdict,
                reasons: vec![],
            }
        };
        let rows = [
            row("n2", "slurm:9.0", 0, 2, true, Verdict::Pass),
            row("n1", "slurm:9.0", 0, 2, false, Verdict::Warn),
            row("n1", "slurm:9.0", 1000, 1, true, Verdict::Pass),
            row("n1", "slurm:9.1", 0, 1, true, Verdict::Pass),
        ];
        let joined = join_nodes(&rows);
        assert_eq!(joined.len(), 3);
        let j = &joined[0];
        assert_eq!(j.nodes, ["n1", "n2"]);
        assert_eq!(j.ids, [rows[1].id, rows[0].id]);
        assert_eq!(
            (j.processes, j.finished, j.verdict),
            (4, false, Verdict::Warn)
        );
        assert_eq!(
            (joined[1].processes, joined[2].workload_key.as_str()),
            (1, "slurm:9.1")
        );
    }
}
