//! Variables that every rank of one NCCL communicator (or both ends of a UCX endpoint pair)
//! must see with the same value, and the rule that keeps per-node environments from
//! splitting a run.
//!
//! Heddle gives each node its own environment (plugin recommendations, site and node
//! tuning profiles, a sweep's kept winner). Most NCCL settings are read by each rank on its
//! own during `ncclCommInitRank` and never exchanged: when two ranks read different values
//! they build different channel counts, buffers or algorithms and wait for each other at
//! the first collective. A node tuning profile `NCCL_MAX_NCHANNELS=1` on one of two nodes
//! hung both ranks of a two-node run at the first all_reduce (NCCL 2.28.3, two H200s).
//!
//! [`CATALOGUE`] says, for each variable that matters, whether its value must agree, why
//! (the NCCL or UCX source that reads it) and what a mismatch does. [`splits`] finds the
//! variables on which the ranks of a run would disagree, with every node's value and its
//! source; [`EnvSplits`] is the refusal people read. [`job_env_leave_out`] is the same rule
//! for the job env files written per node.
//!
//! Sources are NVIDIA/nccl at master (2.28/2.29 line) and openucx/ucx; the `evidence` of
//! each entry names the file and function.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::jobs::EnvVar;

/// Whether a variable must be equal on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Agreement {
    /// Read per rank and never exchanged: a difference breaks the communicator. A run
    /// whose ranks would differ is refused.
    Must,
    /// Read per rank; a difference works but makes one side slower (asymmetric paths).
    /// Reported, not refused.
    Should,
    /// NCCL exchanges it during init and every rank takes the common answer: a difference
    /// is harmless.
    Reconciled,
    /// Names this node's own hardware (HCAs, interfaces, GID indexes): it is expected to
    /// differ and stays per node.
    PerNode,
}

/// What a mismatch does to the communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mismatch {
    /// Both ranks wait for each other forever (no error, nothing in the log).
    Hang,
    /// Init or the first connection fails with an error.
    Error,
    /// It runs, slower than either value would alone.
    Slowdown,
    /// Nothing: the value is reconciled, or is meant to differ.
    None,
}

/// One catalogued variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub name: &'static str,
    pub agreement: Agreement,
    pub mismatch: Mismatch,
    /// Where it is read and why that matters: source file and function.
    pub evidence: &'static str,
    /// What a two-rank run with differing values did on real GPUs, when it was measured.
    pub measured: Option<&'static str>,
}

const fn must(name: &'static str, mismatch: Mismatch, evidence: &'static str) -> Entry {
    Entry {
        name,
        agreement: Agreement::Must,
        mismatch,
        evidence,
        measured: None,
    }
}

const fn entry(
    name: &'static str,
    agreement: Agreement,
    mismatch: Mismatch,
    evidence: &'static str,
) -> Entry {
    Entry {
        name,
        agreement,
        mismatch,
        evidence,
        measured: None,
    }
}

/// The setup of the `measured` notes below: two processes, one H200 each, NCCL 2.28.9
/// (PyTorch 2.11), `NCCL_HOSTID` differing so NCCL treats them as two nodes (socket
/// transport between them, no IB device), `NCCL_NVLS_ENABLE=0`, the variable set in rank
/// 1 only; 1 MiB and 64 MiB all_reduce, then a 16 MiB send/recv; 12 s per case
/// (`scripts/device/must-agree-evidence.sh` measures the same way).
pub const MEASURED_SETUP: &str = "2 x H200, NCCL 2.28.9, one process per GPU, NCCL_HOSTID per \
    rank (socket transport), value in rank 1 only";

/// What a difference did with both ranks on one host (two processes, one H200 each, NVLink
/// NV18, NCCL 2.28.9 from PyTorch 2.11, no NCCL_HOSTID, the variable in rank 1 only, 64 MiB
/// all_reduce, 25 s allowed where an equal setting finishes in under 10 s).
const INTRA_1_HANG: &str =
    "1 on rank 1, both ranks on one host (NVLink): hung (no progress in 25 s)";
const INTRA_LOC_HANG: &str =
    "LOC on rank 1, both ranks on one host (NVLink): hung (no progress in 25 s)";

const POSTSET: &str = "src/graph/connect.cc ncclTopoPostset: the channel count is clamped by \
    ncclMaxNchannels()/ncclMinNchannels() (and config.maxCTAs/minCTAs) after AllGather3 has \
    exchanged the graphs, so each rank keeps its own clamp; ranks then post different numbers \
    of channels and wait for peers that never come";
const P2P_NET_CHUNK: &str = "src/init.cc computeBuffSizes sets comm->p2pChunkSize from this rank's \
     NCCL_P2P_NET_CHUNKSIZE when the communicator spans nodes; send and receive of one \
     point-to-point operation then cut the buffer in different chunks";
const NCHANNELS_PER_NET_PEER: &str = "src/init.cc (NCHANNELS_PER_NET_PEER) sets how many channels this rank opens per \
     network peer for point-to-point; the peer opens its own count";
const NET: &str = "src/init.cc reads NCCL_NET to pick the network transport (IB, Socket or a \
     plugin's) per rank; ranks on different transports cannot connect";
const PXN: &str = "src/graph/paths.cc ncclPxnDisable decides per rank whether a send goes through a \
     peer GPU's NIC (PXN); the receiving side expects the connection from the other \
     proxy";
const BUFFSIZES: &str = "src/init.cc computeBuffSizes: comm->buffSizes[] (LL, LL128, Simple) \
    are taken from this rank's environment and not exchanged; the step size each side uses \
    on a connection comes from its own buffer size";
const TUNING: &str = "src/graph/tuning.cc ncclTopoTuneModel parses NCCL_ALGO/NCCL_PROTO into \
    this rank's algoEnable/protoEnable, and src/enqueue.cc topoGetAlgoInfo picks each \
    collective's algorithm and protocol from them per rank with no exchange: ranks run \
    different algorithms against each other";

/// Every catalogued variable. Names not listed are treated as free to differ.
pub const CATALOGUE: &[Entry] = &[
    Entry {
        measured: Some(
            "NCCL 2.28.3, 2 x H200, one process per GPU: 1 on rank 1 only hung both ranks at \
             the first all_reduce (over 9 minutes, no log line). NCCL 2.28.9: both ranks \
             failed at the first all_reduce with an internal error; equal values ran",
        ),
        ..must("NCCL_MAX_NCHANNELS", Mismatch::Hang, POSTSET)
    },
    Entry {
        measured: Some("8 on rank 1: both ranks failed at the first all_reduce (internal error)"),
        ..must("NCCL_MIN_NCHANNELS", Mismatch::Error, POSTSET)
    },
    must(
        "NCCL_MAX_NRINGS",
        Mismatch::Hang,
        "legacy name of NCCL_MAX_NCHANNELS (src/graph/connect.cc ncclMaxNchannels)",
    ),
    must(
        "NCCL_MIN_NRINGS",
        Mismatch::Hang,
        "legacy name of NCCL_MIN_NCHANNELS (src/graph/connect.cc ncclMinNchannels)",
    ),
    must("NCCL_MAX_CTAS", Mismatch::Hang, POSTSET),
    must("NCCL_MIN_CTAS", Mismatch::Hang, POSTSET),
    Entry {
        measured: Some("Tree on rank 1: both ranks hung at the first all_reduce (1 MiB)"),
        ..must("NCCL_ALGO", Mismatch::Hang, TUNING)
    },
    Entry {
        measured: Some("LL on rank 1: both ranks hung at the first all_reduce (1 MiB)"),
        ..must("NCCL_PROTO", Mismatch::Hang, TUNING)
    },
    Entry {
        measured: Some(
            "1 MiB on rank 1: the 1 MiB all_reduce ran, both ranks hung at 64 MiB (a small \
             size passing proves nothing)",
        ),
        ..must("NCCL_BUFFSIZE", Mismatch::Hang, BUFFSIZES)
    },
    must("NCCL_LL_BUFFSIZE", Mismatch::Hang, BUFFSIZES),
    Entry {
        measured: Some(
            "65536 on rank 1: ran, but LL128 was not chosen over sockets, so this says \
             nothing about fabrics where it is",
        ),
        ..must("NCCL_LL128_BUFFSIZE", Mismatch::Hang, BUFFSIZES)
    },
    Entry {
        measured: Some(
            "32768 on rank 1: all_reduce ran, both ranks hung at the send/recv; equal values \
             ran",
        ),
        ..must("NCCL_P2P_NET_CHUNKSIZE", Mismatch::Hang, P2P_NET_CHUNK)
    },
    must(
        "NCCL_P2P_NVL_CHUNKSIZE",
        Mismatch::Hang,
        "src/init.cc computeBuffSizes: p2pChunkSize for all-NVLink communicators, per rank",
    ),
    must(
        "NCCL_P2P_PCI_CHUNKSIZE",
        Mismatch::Hang,
        "src/init.cc computeBuffSizes: p2pChunkSize for PCI communicators, per rank",
    ),
    Entry {
        measured: Some(
            "1 on rank 1: all_reduce ran, both ranks failed at the send/recv (internal \
             error); equal values ran",
        ),
        ..must(
            "NCCL_NCHANNELS_PER_NET_PEER",
            Mismatch::Error,
            NCHANNELS_PER_NET_PEER,
        )
    },
    Entry {
        measured: Some("128 on rank 1: all_reduce and send/recv ran, same bandwidth"),
        ..entry(
            "NCCL_NTHREADS",
            Agreement::Should,
            Mismatch::Slowdown,
            "src/graph/tuning.cc ncclTopoTuneModel sets comm->maxThreads per rank; the \
             threads split each step's data locally, the buffers and steps stay those of \
             the (agreed) buffer size",
        )
    },
    entry(
        "NCCL_LL128_NTHREADS",
        Agreement::Should,
        Mismatch::Slowdown,
        "src/graph/tuning.cc ncclTopoTuneModel, per rank, like NCCL_NTHREADS",
    ),
    Entry {
        measured: Some(
            "Socket on rank 1: ran, but the machine had no IB device, so both ranks were on sockets anyway",
        ),
        ..must("NCCL_NET", Mismatch::Error, NET)
    },
    must(
        "NCCL_IB_DISABLE",
        Mismatch::Error,
        "src/transport/net_ib/init.cc ncclIbInit returns an error when set, so that rank \
         falls back to sockets while its peer uses IB; their handles do not connect",
    ),
    Entry {
        measured: Some("1 on rank 1: ran on a machine without NICs, where PXN never applies"),
        ..must("NCCL_PXN_DISABLE", Mismatch::Hang, PXN)
    },
    Entry {
        measured: Some("1 on rank 1: ran (no NIC to cross here)"),
        ..entry(
            "NCCL_CROSS_NIC",
            Agreement::Should,
            Mismatch::Slowdown,
            "src/graph/search.cc ncclTopoCompute reads it per rank for the graph search; the \
             graphs' crossNic is exchanged in AllGather3 (src/init.cc) but the rings keep each \
             node's NIC choice",
        )
    },
    entry(
        "NCCL_NET_GDR_LEVEL",
        Agreement::Should,
        Mismatch::Slowdown,
        "src/graph/paths.cc ncclTopoCheckGdr decides per rank whether its own buffers are \
         registered for GPUDirect RDMA; each side places only its own memory",
    ),
    entry(
        "NCCL_NET_GDR_READ",
        Agreement::Should,
        Mismatch::Slowdown,
        "src/graph/paths.cc ncclTopoCheckGdr (send side only), per rank",
    ),
    // The intra-node P2P switches: measured with both ranks on one host, which is what two
    // Heddle nodes on one machine are (one agent per GPU, as on a slice of an HGX board):
    // a difference there hangs both ranks, so they must agree like the channel settings.
    Entry {
        measured: Some(INTRA_LOC_HANG),
        ..must(
            "NCCL_P2P_LEVEL",
            Mismatch::Hang,
            "src/graph/paths.cc ncclGetUserP2pLevel: intra-node P2P vs SHM, decided per rank; \
             the ranks then build different transports to each other",
        )
    },
    Entry {
        measured: Some(INTRA_1_HANG),
        ..must(
            "NCCL_P2P_DISABLE",
            Mismatch::Hang,
            "src/graph/paths.cc ncclGetUserP2pLevel (legacy switch of NCCL_P2P_LEVEL); over \
             sockets with one rank per host (NCCL_HOSTID) it ran, since P2P is then unused",
        )
    },
    Entry {
        measured: Some(INTRA_1_HANG),
        ..must(
            "NCCL_P2P_USE_CUDA_MEMCPY",
            Mismatch::Hang,
            "src/transport/p2p.cc p2pSetup: the copy engine path is chosen per rank and changes \
             what each side of the connection expects",
        )
    },
    Entry {
        measured: Some("0 on rank 1, both ranks on one host (NVLink): hung (no progress in 25 s)"),
        ..must(
            "NCCL_CUMEM_ENABLE",
            Mismatch::Hang,
            "src/misc/cudawrap.cc ncclCuMemEnable, per rank: cuMem and legacy IPC handles are \
             exchanged between peers and cannot be opened by the other kind",
        )
    },
    Entry {
        measured: Some("1 on rank 1: ran"),
        ..entry(
            "NCCL_SHM_DISABLE",
            Agreement::Should,
            Mismatch::Slowdown,
            "src/transport/shm.cc: intra-node shared-memory transport, per rank",
        )
    },
    entry(
        "NCCL_NVLS_ENABLE",
        Agreement::Reconciled,
        Mismatch::None,
        "src/init.cc: the NVLS graph's nChannels is the minimum over AllGather3, and \
         nvlsSupport is dropped on every rank when it is 0",
    ),
    entry(
        "NCCL_COLLNET_ENABLE",
        Agreement::Reconciled,
        Mismatch::None,
        "src/init.cc: collNetSupport is all-gathered (collNetSupportMatrix) and CollNet is \
         used only when every rank supports it",
    ),
    // Not refused: per-node transport lists are normal (a plugin recommends `rc` only where
    // the node has an HCA), and UCX negotiates them per endpoint pair.
    entry(
        "UCX_TLS",
        Agreement::Should,
        Mismatch::Slowdown,
        "ucp wireup (src/ucp/wireup/select.c ucp_wireup_select_lanes) selects lanes among the \
         transports both ends enabled, so differing lists run over what they share; only lists \
         with nothing in common fail, at connection, with 'no remote ep address' / \
         'Destination is unreachable' (an error, not a hang)",
    ),
    entry(
        "NCCL_IB_HCA",
        Agreement::PerNode,
        Mismatch::None,
        "names this node's HCAs (src/transport/net_ib/init.cc); expected to differ",
    ),
    entry(
        "NCCL_SOCKET_IFNAME",
        Agreement::PerNode,
        Mismatch::None,
        "names this node's interfaces (src/misc/socket.cc ncclFindInterfaces); expected to \
         differ",
    ),
    entry(
        "NCCL_IB_GID_INDEX",
        Agreement::PerNode,
        Mismatch::None,
        "this node's RoCE GID table (src/transport/net_ib/connect.cc); the GID itself is \
         exchanged at connect, so the index may differ",
    ),
    entry(
        "UCX_NET_DEVICES",
        Agreement::PerNode,
        Mismatch::None,
        "names this node's devices; ucp exchanges addresses at wireup",
    ),
    entry(
        "UCX_IB_GID_INDEX",
        Agreement::PerNode,
        Mismatch::None,
        "this node's RoCE GID table; the GID is exchanged at wireup",
    ),
];

/// The catalogue's entry for `name`.
pub fn find(name: &str) -> Option<&'static Entry> {
    CATALOGUE.iter().find(|e| e.name == name)
}

/// Whether the ranks of one run must see `name` with the same value.
pub fn must_agree(name: &str) -> bool {
    find(name).is_some_and(|e| e.agreement == Agreement::Must)
}

/// One value of a split variable and the nodes that would get it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SplitValue {
    /// `None`: unset there (NCCL's own default).
    pub value: Option<String>,
    /// Where the value came from on these nodes (`tuning:<profile>`, a plugin, ...); one
    /// entry per distinct source, empty when unset.
    pub sources: Vec<String>,
    pub nodes: Vec<String>,
}

/// A must-agree variable on which the nodes of one run differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Split {
    pub name: String,
    /// Most common value first, then by value.
    pub values: Vec<SplitValue>,
}

/// The must-agree variables on which `nodes` (name and that node's environment with
/// sources, as `runs_env` composes it) differ. A variable set on some nodes and unset on
/// others differs too: NCCL's default is a value of its own. Sorted by variable name.
pub fn splits<'a>(nodes: impl IntoIterator<Item = (&'a str, &'a [EnvVar])>) -> Vec<Split> {
    let nodes: Vec<(&str, &[EnvVar])> = nodes.into_iter().collect();
    let mut names: Vec<&str> = nodes
        .iter()
        .flat_map(|(_, env)| env.iter().map(|v| v.name.as_str()))
        .filter(|n| must_agree(n))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut out = Vec::new();
    for name in names {
        let mut by_value: BTreeMap<Option<&str>, SplitValue> = BTreeMap::new();
        for (node, env) in &nodes {
            let var = env.iter().find(|v| v.name == name);
            let slot = by_value
                .entry(var.map(|v| v.value.as_str()))
                .or_insert_with(|| SplitValue {
                    value: var.map(|v| v.value.clone()),
                    sources: Vec::new(),
                    nodes: Vec::new(),
                });
            slot.nodes.push((*node).to_string());
            if let Some(v) = var
                && !slot.sources.contains(&v.source)
            {
                slot.sources.push(v.source.clone());
            }
        }
        if by_value.len() < 2 {
            continue;
        }
        let mut values: Vec<SplitValue> = by_value.into_values().collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.nodes.len()));
        out.push(Split {
            name: name.to_string(),
            values,
        });
    }
    out
}

/// A run refused because its ranks would disagree on must-agree variables; its `Display`
/// is the message people read (the variable, each node's value and its source, the fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSplits(pub Vec<Split>);

/// Nodes listed in a message before "and N more".
const NODES_SHOWN: usize = 8;

impl fmt::Display for EnvSplits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the ranks of this run would not agree on ")?;
        for (i, split) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let how = match find(&split.name).map(|e| e.mismatch) {
                Some(Mismatch::Error) => "a mismatch fails the communicator",
                _ => "a mismatch hangs every rank at the first collective",
            };
            write!(f, "{} ({how}): ", split.name)?;
            for (j, v) in split.values.iter().enumerate() {
                if j > 0 {
                    f.write_str(", ")?;
                }
                write_nodes(f, &v.nodes)?;
                match &v.value {
                    Some(value) => write!(f, " {value:?} from {}", v.sources.join(" and "))?,
                    None => f.write_str(" unset")?,
                }
            }
        }
        let names: Vec<&str> = self.0.iter().map(|s| s.name.as_str()).collect();
        write!(
            f,
            ". Set {} in the run's env (it then applies to every node), or move the value to \
             a site-wide tuning profile so every node gets it",
            names.join(", ")
        )
    }
}

fn write_nodes(f: &mut fmt::Formatter<'_>, nodes: &[String]) -> fmt::Result {
    let shown = &nodes[..nodes.len().min(NODES_SHOWN)];
    f.write_str(&shown.join(" "))?;
    if nodes.len() > shown.len() {
        write!(f, " and {} more", nodes.len() - shown.len())?;
    }
    Ok(())
}

impl std::error::Error for EnvSplits {}

/// Refuses nodes whose environments split a must-agree variable. The run's own `env` is
/// layered on top of every node's before this is asked (`runs_env`), so a variable the
/// run sets can never split: that is how the run's env wins.
pub fn check<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a [EnvVar])>,
) -> Result<(), EnvSplits> {
    let found = splits(nodes);
    if found.is_empty() {
        Ok(())
    } else {
        Err(EnvSplits(found))
    }
}

/// The warning code of a variable left out of a node's job env file.
pub const ENV_SPLITS_COMMUNICATOR: &str = "env-splits-communicator";

/// A must-agree variable left out of a node's job env file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeftOut {
    pub name: String,
    /// This node's value, which is not written.
    pub value: String,
    /// [`ENV_SPLITS_COMMUNICATOR`].
    pub code: String,
    /// Site peers whose value differs (or who lack it), sorted.
    pub differing_nodes: Vec<String>,
    pub message: String,
}

impl LeftOut {
    /// A must-agree variable left out because agreement with the node's peers cannot be
    /// shown (`why`): the node has no site, or its site is too large to compare.
    pub fn unshown(name: String, value: String, why: &str) -> Self {
        LeftOut {
            message: format!(
                "{name}={value} is left out: {why}, and ranks of one communicator must agree \
                 on it; give the node a site and the value to the whole site (a site-wide \
                 tuning profile), or set it in the job itself"
            ),
            name,
            value,
            code: ENV_SPLITS_COMMUNICATOR.to_string(),
            differing_nodes: Vec::new(),
        }
    }
}

/// Which of `env`'s must-agree variables a job env file for `node` must leave out: a job
/// spanning this node and a peer of its site would otherwise split its communicator. Such
/// a variable is written only when every node of the site has the same value; everything
/// else in `env` is written as usual. `peers` are the site's other nodes.
pub fn job_env_leave_out<'a>(
    node: &str,
    env: &BTreeMap<String, String>,
    peers: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>)>,
) -> Vec<LeftOut> {
    let peers: Vec<(&str, &BTreeMap<String, String>)> = peers
        .into_iter()
        .filter(|(name, _)| *name != node)
        .collect();
    let mut out = Vec::new();
    for (name, value) in env {
        if !must_agree(name) {
            continue;
        }
        let mut differing: Vec<String> = peers
            .iter()
            .filter(|(_, penv)| penv.get(name) != Some(value))
            .map(|(p, _)| (*p).to_string())
            .collect();
        if differing.is_empty() {
            continue;
        }
        differing.sort();
        let shown = differing.len().min(NODES_SHOWN);
        let more = if differing.len() > shown {
            format!(" and {} more", differing.len() - shown)
        } else {
            String::new()
        };
        out.push(LeftOut {
            message: format!(
                "{name}={value} is left out: {}{more} of the same site do not have it, and \
                 ranks of one communicator must agree on it; give it to the whole site (a \
                 site-wide tuning profile) or set it in the job itself",
                differing[..shown].join(" ")
            ),
            name: name.clone(),
            value: value.clone(),
            code: ENV_SPLITS_COMMUNICATOR.to_string(),
            differing_nodes: differing,
        });
    }
    out
}

#[cfg(test)]
#[path = "must_agree/tests.rs"]
mod tests;
