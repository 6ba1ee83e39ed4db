//! One series drawn over time (`GET /api/v1/regressions/series`): its figures, its change
//! points and what changed on the node meanwhile, so a person sees a level shift next to
//! the driver update that caused it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{FactChange, Regression};

/// The most points one chart answers: a longer range is thinned evenly (`stride`).
pub const MAX_CHART_POINTS: usize = 1000;

/// Ranges longer than this many days are drawn from the series' daily rollups, one point a
/// day; shorter ones from its figures, one point a result.
pub const RAW_MAX_DAYS: i64 = 30;

/// What one point of a chart stands for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// One result's figure: `result_id` and `run_id` are set.
    #[default]
    Points,
    /// One UTC day of the series (`t` its 00:00): `value` is the day's median, `n`, `min`
    /// and `max` its count and extremes. Ranges over [`RAW_MAX_DAYS`] days, and history
    /// older than the figures' retention, are drawn this way.
    Days,
}

/// One result's figure of the series, or one day of it (see [`Resolution`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChartPoint {
    /// When the result was received (the time change points are placed at); a day's 00:00
    /// UTC.
    pub t: DateTime<Utc>,
    pub value: f64,
    /// The result (a point of a result; absent for a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_id: Option<Uuid>,
    /// Its run (a point of a result whose verdict is still kept; absent for a day).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Uuid>,
    /// How many figures the day had (a day only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<i64>,
    /// The day's lowest figure (a day only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// The day's highest figure (a day only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
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
    /// What each of `points` stands for: a result's figure, or a day of them.
    #[serde(default)]
    pub resolution: Resolution,
    /// Oldest first, at most [`MAX_CHART_POINTS`].
    pub points: Vec<ChartPoint>,
    /// How many points (of the resolution) the range holds; more than `points` when thinned.
    pub total_points: i64,
    /// Every `stride`-th point of the range is drawn, counted back from the newest (1: all).
    pub stride: i64,
    /// The series' change points in the range, oldest first, improvements and superseded
    /// changes included (each says whether it is `open`).
    pub change_points: Vec<Regression>,
    /// The node's facts changes in the range, oldest first.
    pub facts_markers: Vec<FactsMarker>,
}
