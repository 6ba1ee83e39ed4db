//! Investigations: pairwise runs that find the bad node or link of a slow multi-node run,
//! and the GPU×GPU matrix of a `p2p` result.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Which pairwise test an investigation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum InvestigationKind {
    /// A two-node NCCL collective per pair; the figure is busbw at the largest size.
    Nccl,
    /// A perftest bandwidth test per pair; the figure is the bandwidth at the largest size.
    Rdma,
}

impl InvestigationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            InvestigationKind::Nccl => "nccl",
            InvestigationKind::Rdma => "rdma",
        }
    }

    /// The result-row column the matrix holds.
    pub fn metric(self) -> &'static str {
        match self {
            InvestigationKind::Nccl => "busbw_gbs",
            InvestigationKind::Rdma => "algbw_gbs",
        }
    }
}

impl std::str::FromStr for InvestigationKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nccl" => Ok(InvestigationKind::Nccl),
            "rdma" => Ok(InvestigationKind::Rdma),
            _ => Err(format!("unknown investigation kind {s:?}")),
        }
    }
}

/// Default of [`InvestigationCreate::threshold`].
pub const DEFAULT_THRESHOLD: f64 = 0.75;

/// Request to test every pair of the given nodes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InvestigationCreate {
    /// Node ids or hostnames, 2 to 64 of them.
    pub nodes: Vec<String>,
    pub kind: InvestigationKind,
    /// Params of every pair's run, as for a run of this kind (e.g. `{"op": "all_gather",
    /// "max_bytes": 1073741824}` for nccl, `{"test": "ib_write_bw"}` for rdma).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: serde_json::Value,
    /// Environment of every pair's test process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub timeout_s: Option<u32>,
    /// Pairs run at a time, no node in two of them; 0 queues every pair at once, ordered so
    /// that each node works through its pairs round by round.
    #[serde(default)]
    pub batch_size: u32,
    /// A node or link is named when its figure is below this fraction of the median it is
    /// compared with (default 0.75; between 0.05 and 0.95).
    #[serde(default)]
    pub threshold: Option<f64>,
    #[serde(default)]
    pub label: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum InvestigationState {
    Running,
    /// Every pair ran or failed; the analysis is final.
    Done,
    /// It could not go on (a node was removed) or no pair produced a figure.
    Failed,
}

impl InvestigationState {
    pub fn as_str(self) -> &'static str {
        match self {
            InvestigationState::Running => "running",
            InvestigationState::Done => "done",
            InvestigationState::Failed => "failed",
        }
    }
}

impl std::str::FromStr for InvestigationState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "running" => Ok(InvestigationState::Running),
            "done" => Ok(InvestigationState::Done),
            "failed" => Ok(InvestigationState::Failed),
            _ => Err(format!("unknown investigation state {s:?}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PairState {
    /// Waiting for its batch.
    Pending,
    /// Its run is queued or running.
    Running,
    Done,
    /// Its run failed, was cancelled or skipped, or gave no figure.
    Failed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InvestigationNode {
    pub id: Uuid,
    pub hostname: String,
}

/// One pair of nodes and the run that measured it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InvestigationPair {
    /// Hostnames; `a` is rank 0 of the pair's run.
    pub a: String,
    pub b: String,
    /// The batch (0-based) the pair runs in.
    pub batch: i32,
    pub state: PairState,
    pub run_id: Option<Uuid>,
    /// The headline figure in GB/s.
    pub value: Option<f64>,
    /// The message size the figure was measured at.
    pub size_bytes: Option<i64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InvestigationProgress {
    pub pairs_total: u32,
    /// Pairs that ended, with a figure or not.
    pub pairs_done: u32,
    pub pairs_failed: u32,
    pub pairs_running: u32,
    pub batches_total: u32,
}

/// A square matrix of one figure: `values[i][j]` between `labels[i]` and `labels[j]`
/// (`null` where nothing was measured). A node matrix is symmetric with an empty diagonal; a
/// GPU matrix is directed (`i` copies to `j`) and its diagonal holds copies within a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Matrix {
    pub labels: Vec<String>,
    /// e.g. `busbw_gbs`, `algbw_gbs`.
    pub metric: String,
    pub unit: String,
    pub values: Vec<Vec<Option<f64>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Conclusion {
    /// Still measuring.
    Pending,
    /// One or more nodes or links are named.
    Culprit,
    /// Every pair measured, and none stands out.
    NoCulprit,
    /// Pairs are missing, or the figures cannot tell (e.g. two nodes give one pair).
    Inconclusive,
}

impl Conclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Conclusion::Pending => "pending",
            Conclusion::Culprit => "culprit",
            Conclusion::NoCulprit => "no_culprit",
            Conclusion::Inconclusive => "inconclusive",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum CulpritKind {
    /// A node (a GPU, in a GPU matrix) whose pairs are low.
    Node,
    /// One low pair whose two ends are otherwise fine (a GPU pair: NVLink or PCIe path).
    Link,
}

/// One figure between two labels of a matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PairFigure {
    pub from: String,
    pub to: String,
    pub value: f64,
}

/// A named culprit and the evidence it rests on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Culprit {
    pub kind: CulpritKind,
    /// The node, or the link's two ends.
    pub members: Vec<String>,
    /// For a node its row's median (the upper one, so at least half its pairs are below
    /// it); for a link its lowest direction.
    pub figure: f64,
    /// The median of the pairs it was compared with (those not involving it).
    pub median: f64,
    /// `figure / median`.
    pub ratio: f64,
    /// The pairs' figures behind the finding.
    pub figures: Vec<PairFigure>,
    pub explanation: String,
}

/// What the matrix says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Analysis {
    pub verdict: Conclusion,
    /// In an inconclusive analysis, suspects from the pairs that were measured.
    pub culprits: Vec<Culprit>,
    /// Median of every measured pair.
    pub median: Option<f64>,
    pub threshold: f64,
    /// Pairs without a figure.
    pub missing: Vec<[String; 2]>,
    /// One or two sentences for people.
    pub summary: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Investigation {
    pub id: Uuid,
    pub kind: InvestigationKind,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: serde_json::Value,
    pub env: BTreeMap<String, String>,
    pub timeout_s: Option<u32>,
    pub batch_size: u32,
    pub threshold: f64,
    pub label: Option<String>,
    pub state: InvestigationState,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// The run whose warn or fail verdict started it; `null` when started by hand.
    pub trigger_run_id: Option<Uuid>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub nodes: Vec<InvestigationNode>,
    pub progress: InvestigationProgress,
    pub matrix: Matrix,
    pub analysis: Analysis,
    pub pairs: Vec<InvestigationPair>,
    /// The runs it started, in batch order.
    pub runs: Vec<Uuid>,
}

/// An investigation in a list: no pairs or matrix.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InvestigationSummary {
    pub id: Uuid,
    pub kind: InvestigationKind,
    pub state: InvestigationState,
    pub label: Option<String>,
    pub trigger_run_id: Option<Uuid>,
    pub nodes: Vec<String>,
    pub progress: InvestigationProgress,
    pub verdict: Conclusion,
    pub culprits: Vec<Culprit>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The GPU×GPU matrix of a `p2p` result: device-to-device bandwidth at the largest size.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct P2pMatrix {
    pub result_id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    /// `algbw_gbs` of `d2d` rows; labels are the GPU indexes.
    pub matrix: Matrix,
    /// The copy path of each cell (`p2p`, `staged`, `local`), `null` where none.
    pub paths: Vec<Vec<Option<String>>>,
    pub analysis: Analysis,
}
