//! One measured row of a result: what every kind's runner writes and every reader judges.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One measured row: one message size of a sweep, one cell of a tuning grid, ...
/// The columns mirror nccl-tests; perftest/UCX figures that have no column go in `extra`.
/// `Default` is a row of size 0 with nothing measured: the base for a row that carries
/// only some columns (what a reader of stored rows selected).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultRow {
    pub size_bytes: i64,
    #[serde(default)]
    pub count: Option<i64>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub op: Option<String>,
    #[serde(default)]
    pub root: Option<i32>,
    #[serde(default)]
    pub in_place: Option<bool>,
    #[serde(default)]
    pub time_us: Option<f64>,
    #[serde(default)]
    pub algbw_gbs: Option<f64>,
    #[serde(default)]
    pub busbw_gbs: Option<f64>,
    /// Elements that failed validation.
    #[serde(default)]
    pub wrong: Option<i64>,
    /// Which cell of a sweep this row belongs to, e.g. `NCCL_ALGO=Ring`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub extra: serde_json::Value,
}
