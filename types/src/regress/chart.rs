//! One series drawn over time (`GET /api/v1/regressions/series`): its figures, its change
//! points and what changed on the node meanwhile, so a person sees a level shift next to
//! the driver update that caused it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{FactChange, Regression};

/// The most points one chart answers: a longer range is thinned evenly (`stride`).
pub const MAX_CHART_POINTS: usize = 1000;

/// One result's figure of the series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChartPoint {
    /// When the result was received (the time change points are placed at).
    pub t: DateTime<Utc>,
    pub value: f64,
    pub result_id: Uuid,
    pub run_id: Uuid,
}

/// What changed in the node's facts when a new snapshot of them arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FactsMarker {
    /// When the changed facts were collected.
    pub t: DateTime<Utc>,
    /// The compared fields that differ from the snapshot before (driver, CUDA, NCCL, kernel,
    /// firmware, ...), never empty.
    pub changes: Vec<FactChange>,
}

/// A series over a time range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SeriesChart {
    pub node_id: Uuid,
    pub hostname: String,
    pub test: String,
    pub metric: String,
    pub size_band: i32,
    pub world_size: i32,
    /// The GPU pair of a per-pair series (`0-1`), as [`Regression::pair`]; absent for the
    /// others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<String>,
    /// The range asked for; no `since` is the series' whole stored history.
    pub since: Option<DateTime<Utc>>,
    pub until: DateTime<Utc>,
    /// Oldest first, at most [`MAX_CHART_POINTS`].
    pub points: Vec<ChartPoint>,
    /// How many points the range holds; more than `points` when thinned.
    pub total_points: i64,
    /// Every `stride`-th point of the range is drawn, counted back from the newest (1: all).
    pub stride: i64,
    /// The series' change points in the range, oldest first, improvements and superseded
    /// changes included (each says whether it is `open`).
    pub change_points: Vec<Regression>,
    /// The node's facts changes in the range, oldest first.
    pub facts_markers: Vec<FactsMarker>,
}
