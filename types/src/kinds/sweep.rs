//! `sweep`: the `nccl` measurement over a grid of NCCL variables, one cell at a time. Its
//! cells are not comparable with each other or with plain runs: only its validation is
//! judged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::nccl::{NCCL_DOCS, NcclParams};
use super::{Judged, TestKind};
use crate::env_policy;
use crate::params::ParamType::EnvGrid;
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;

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

impl TestKind for SweepParams {
    type Summary = ();

    fn judged(&self, _rows: &[ResultRow]) -> Judged {
        Judged {
            test: format!("sweep.{}", self.nccl.op),
            figures: Vec::new(),
        }
    }
}
