//! The `nccl` and `sweep` kinds' parameters, and the NCCL names they accept.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ParamType::{Boolean, Duration as Dur, EnvGrid, Integer, String as Str};
use super::{KindParams, ParamDoc, ParamError};
use crate::collective::{COLLECTIVES, canonical_collective};
use crate::env_policy;

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

const NCCL_DOCS: &[ParamDoc] = &[
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

/// `rdma_ab`: the `nccl` measurement twice, with the node's environment and forced to
/// sockets; the same parameters as `nccl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RdmaAbParams(pub NcclParams);

impl KindParams for RdmaAbParams {
    const KIND: &'static str = crate::rdma_ab::KIND;
    const DESCRIPTION: &'static str = "The same NCCL sweep with the node's environment and \
        forced to sockets (NCCL_IB_DISABLE=1): both tables and the ratio per size band. Needs \
        two ranks or more (several nodes, or gpus ≥ 2).";
    const PARAMS: &'static [ParamDoc] = NCCL_DOCS;

    fn check(&self) -> Result<(), ParamError> {
        self.0.check()
    }
}

/// One value of a sweep's grid: text, or a number (written as given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GridValue {
    Number(serde_json::Number),
    Text(String),
}

impl GridValue {
    pub fn text(&self) -> String {
        match self {
            GridValue::Number(n) => n.to_string(),
            GridValue::Text(t) => t.clone(),
        }
    }
}

pub const SWEEP_MAX_CELLS: usize = 64;

/// `sweep`: `nccl`'s parameters plus a grid of NCCL variables, one measurement per cell.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct SweepParams {
    #[serde(flatten)]
    pub nccl: NcclParams,
    pub grid: BTreeMap<String, Vec<GridValue>>,
}

impl<'de> Deserialize<'de> for SweepParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut obj = serde_json::Map::deserialize(d)?;
        let grid = obj.remove("grid").unwrap_or(Value::Null);
        let nccl = NcclParams::decode(&Value::Object(obj)).map_err(serde::de::Error::custom)?;
        let grid = match grid {
            Value::Null => BTreeMap::new(),
            g => serde_json::from_value(g)
                .map_err(|e| serde::de::Error::custom(format!("params.grid: {e}")))?,
        };
        Ok(SweepParams { nccl, grid })
    }
}

impl SweepParams {
    /// The cells of the grid, in a stable order (names sorted, values as given).
    pub fn cells(&self) -> Result<Vec<BTreeMap<String, String>>, ParamError> {
        let err = |m: String| ParamError::new("grid", m);
        if self.grid.is_empty() {
            return Err(err(
                "must be a non-empty object of NCCL_* name → list of values".into(),
            ));
        }
        let mut out = vec![BTreeMap::new()];
        for (name, values) in &self.grid {
            let upper = name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !name.starts_with("NCCL_") || !upper {
                return Err(err(format!("key {name:?} is not an NCCL_* variable name")));
            }
            env_policy::check_name(name).map_err(|e| err(format!("key refused: {e}")))?;
            if values.is_empty() {
                return Err(err(format!("{name} must be a non-empty list")));
            }
            let values: Vec<String> = values.iter().map(GridValue::text).collect();
            for v in &values {
                env_policy::check_value(name, v).map_err(|e| err(format!("value refused: {e}")))?;
            }
            out = out
                .into_iter()
                .flat_map(|cell| {
                    values.iter().map(move |v| {
                        let mut c = cell.clone();
                        c.insert(name.clone(), v.clone());
                        c
                    })
                })
                .collect();
            if out.len() > SWEEP_MAX_CELLS {
                return Err(err(format!("has more than {SWEEP_MAX_CELLS} cells")));
            }
        }
        Ok(out)
    }
}

const fn sweep_docs() -> [ParamDoc; NCCL_DOCS.len() + 1] {
    let mut out = [ParamDoc::new(
        "grid",
        EnvGrid,
        "NCCL variables to sweep, each with its values (e.g. NCCL_ALGO: Ring, Tree); at most 64 cells.",
    )
    .required(); NCCL_DOCS.len() + 1];
    let mut i = 0;
    while i < NCCL_DOCS.len() {
        out[i] = NCCL_DOCS[i];
        i += 1;
    }
    out
}

const SWEEP_DOCS: [ParamDoc; NCCL_DOCS.len() + 1] = sweep_docs();

impl KindParams for SweepParams {
    const KIND: &'static str = "sweep";
    const DESCRIPTION: &'static str =
        "The nccl measurement over a grid of NCCL variables, one cell at a time, on one node.";
    const PARAMS: &'static [ParamDoc] = &SWEEP_DOCS;

    /// `nccl`'s defaults; the grid has none.
    fn defaults() -> Value {
        serde_json::to_value(NcclParams::default()).unwrap_or(Value::Null)
    }

    fn decode(params: &Value) -> Result<Self, ParamError> {
        let mut obj = match params {
            Value::Null => serde_json::Map::new(),
            Value::Object(o) => o.clone(),
            other => {
                return Err(ParamError {
                    param: None,
                    message: format!("must be an object, got {other}"),
                });
            }
        };
        let grid = obj.remove("grid").unwrap_or(Value::Null);
        let nccl = NcclParams::decode(&Value::Object(obj))?;
        let grid: BTreeMap<String, Vec<GridValue>> = match grid {
            Value::Null => BTreeMap::new(),
            g => serde_json::from_value(g).map_err(|e| {
                ParamError::new(
                    "grid",
                    format!("{e} (expected NCCL_* name → list of values)"),
                )
            })?,
        };
        let typed = SweepParams { nccl, grid };
        typed.cells()?;
        Ok(typed)
    }
}
