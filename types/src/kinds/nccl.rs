//! `nccl`: nccl-tests' measurement from the agent itself. Its parameters and the NCCL
//! names they accept (shared by `sweep` and `rdma_ab`), its headline (bus bandwidth at the
//! largest size) and the path NCCL's log says it took.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::headline::headline;
use super::{Judged, TestKind, lenient};
use crate::collective::{COLLECTIVES, canonical_collective};
use crate::facts::NodeFacts;
use crate::params::ParamType::{Boolean, Duration as Dur, Integer, String as Str};
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;
use crate::transport::{Finding, NcclEvidence, classify_nccl};

pub const NCCL_MAX_BYTES: u64 = 16 << 30;
pub const NCCL_MAX_ITERS: u64 = 100_000;
/// The longest budget an adaptive NCCL measurement may be given.
pub const MAX_BUDGET: Duration = Duration::from_secs(3600);

/// NCCL's data types, as nccl-tests names them.
pub const DTYPES: [&str; 10] = [
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
];
pub const REDOPS: [&str; 5] = ["sum", "prod", "max", "min", "avg"];

/// The canonical name of a data type given in any accepted spelling (`bf16`, `fp32`...).
pub fn canonical_dtype(name: &str) -> Result<&'static str, String> {
    let norm = name.trim().to_ascii_lowercase();
    let alias = match norm.as_str() {
        "char" => "int8",
        "int" => "int32",
        "float16" | "fp16" => "half",
        "float32" | "fp32" => "float",
        "float64" | "fp64" => "double",
        "bf16" => "bfloat16",
        other => other,
    };
    DTYPES
        .into_iter()
        .find(|d| *d == alias)
        .ok_or_else(|| format!("unknown data type {name:?} (one of {})", DTYPES.join(", ")))
}

pub fn canonical_redop(name: &str) -> Result<&'static str, String> {
    let norm = name.trim().to_ascii_lowercase();
    REDOPS
        .into_iter()
        .find(|o| *o == norm)
        .ok_or_else(|| format!("unknown reduction op {name:?} (one of sum, prod, max, min, avg)"))
}

/// A budget: `"10s"`, `"500ms"`, `"2m"` or a number of seconds ([`crate::duration`]).
pub fn parse_budget(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s).map_err(|e| format!("invalid budget: {e}"))
}

/// A duration as a job gives it: text or a number of seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DurationParam {
    Seconds(f64),
    Text(String),
}

impl DurationParam {
    pub fn duration(&self) -> Result<Duration, String> {
        match self {
            DurationParam::Seconds(s) => parse_budget(&s.to_string()),
            DurationParam::Text(t) => parse_budget(t),
        }
    }
}

/// `nccl`: nccl-tests' measurement from the agent itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NcclParams {
    pub op: String,
    pub dtype: String,
    pub redop: String,
    pub root: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_bytes: Option<u64>,
    pub warmup: u64,
    pub iters: u64,
    pub gpus: u64,
    pub check: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<DurationParam>,
}

impl Default for NcclParams {
    fn default() -> Self {
        NcclParams {
            op: "all_reduce".into(),
            dtype: "float".into(),
            redop: "sum".into(),
            root: 0,
            min_bytes: 8,
            max_bytes: 128 << 20,
            factor: 2,
            step_bytes: None,
            warmup: 5,
            iters: 20,
            gpus: 1,
            check: true,
            graph: None,
            budget: None,
        }
    }
}

pub(super) const NCCL_DOCS: &[ParamDoc] = &[
    ParamDoc::new("op", Str, "Collective to measure.")
        .choices(&COLLECTIVES)
        .normalize(canonical_collective),
    ParamDoc::new("dtype", Str, "Element data type.")
        .choices(&DTYPES)
        .normalize(canonical_dtype),
    ParamDoc::new("redop", Str, "Reduction op (reducing collectives only).")
        .choices(&REDOPS)
        .normalize(canonical_redop),
    ParamDoc::new("root", Integer, "Root rank of broadcast and reduce.").range(0.0, 65535.0),
    ParamDoc::new("min_bytes", Integer, "Smallest message size.")
        .unit("bytes")
        .range(1.0, NCCL_MAX_BYTES as f64),
    ParamDoc::new("max_bytes", Integer, "Largest message size.")
        .unit("bytes")
        .range(1.0, NCCL_MAX_BYTES as f64),
    ParamDoc::new("factor", Integer, "Size multiplier between steps.").range(2.0, 1024.0),
    ParamDoc::new(
        "step_bytes",
        Integer,
        "Fixed size increment (replaces factor).",
    )
    .unit("bytes")
    .range(1.0, NCCL_MAX_BYTES as f64),
    ParamDoc::new("warmup", Integer, "Untimed iterations per size.")
        .unit("iterations")
        .range(0.0, NCCL_MAX_ITERS as f64),
    ParamDoc::new("iters", Integer, "Timed iterations per size.")
        .unit("iterations")
        .range(1.0, NCCL_MAX_ITERS as f64),
    ParamDoc::new("gpus", Integer, "GPUs per node (one rank each).")
        .unit("GPUs")
        .range(1.0, 64.0),
    ParamDoc::new("check", Boolean, "Validate the results' values."),
    ParamDoc::new(
        "graph",
        Integer,
        "CUDA graph replays per sample; 0 launches every size; unset: sizes up to 1 MiB replayed once from a graph.",
    )
    .unit("replays")
    .range(0.0, NCCL_MAX_ITERS as f64),
    ParamDoc::new(
        "budget",
        Dur,
        "Adaptive sampling within this time (e.g. 10s).",
    )
    .unit("s"),
];

impl KindParams for NcclParams {
    const KIND: &'static str = "nccl";
    const DESCRIPTION: &'static str =
        "NCCL collective bandwidth over a size sweep, like nccl-tests (one rank per GPU).";
    const PARAMS: &'static [ParamDoc] = NCCL_DOCS;

    fn check(&self) -> Result<(), ParamError> {
        if self.max_bytes < self.min_bytes {
            return Err(ParamError::new(
                "max_bytes",
                format!("{} is below min_bytes ({})", self.max_bytes, self.min_bytes),
            ));
        }
        if let Some(b) = &self.budget {
            let d = b.duration().map_err(|e| ParamError::new("budget", e))?;
            if d.is_zero() || d > MAX_BUDGET {
                return Err(ParamError::new(
                    "budget",
                    format!(
                        "must be above 0 and at most {} s, got {d:?}",
                        MAX_BUDGET.as_secs()
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl TestKind for NcclParams {
    type Summary = NcclSummary;

    fn judged(&self, rows: &[ResultRow]) -> Judged {
        let test = format!("nccl.{}", self.op);
        Judged {
            figures: headline(test.clone(), "busbw_gbs", rows.iter(), false)
                .into_iter()
                .collect(),
            test,
        }
    }

    fn path_line(summary: &NcclSummary) -> Option<String> {
        summary.nccl_evidence.as_ref().map(path_line)
    }

    fn findings(summary: &NcclSummary, facts: Option<&NodeFacts>) -> Vec<Finding> {
        classify_nccl(summary.nccl_evidence.as_ref(), facts)
    }
}

/// What readers take from an `nccl` result's summary (an `rdma_ab` leg's too).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NcclSummary {
    /// What NCCL's INFO log said about the path ([`crate::transport`]).
    #[serde(default, deserialize_with = "lenient")]
    pub nccl_evidence: Option<NcclEvidence>,
}

/// The path NCCL's log says a measurement took: `network IB over mlx5_0:1/IB (GPUDirect
/// RDMA); channels: NET/IB 12, P2P 24`.
pub fn path_line(ev: &NcclEvidence) -> String {
    let devices: Vec<String> = ev
        .devices
        .iter()
        .map(|d| {
            format!(
                "{}:{}/{}",
                d.name,
                d.port.map_or("?".into(), |p| p.to_string()),
                d.link_layer.as_deref().unwrap_or("?")
            )
        })
        .collect();
    let gdr = match ev.gdr {
        Some(true) => " (GPUDirect RDMA)",
        Some(false) => " (no GPUDirect RDMA)",
        None => "",
    };
    let conns: Vec<String> = ev
        .transports
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    format!(
        "network {}{}{gdr}; channels: {}",
        ev.network.as_deref().unwrap_or("unknown"),
        if devices.is_empty() {
            String::new()
        } else {
            format!(" over {}", devices.join(" "))
        },
        if conns.is_empty() {
            "none logged".into()
        } else {
            conns.join(", ")
        }
    )
}
