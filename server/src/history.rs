//! History at scale (docs/health.md, "History"): the tables that grow with every result
//! (`results`, `result_rows`, `verdicts`, `series_points`) are partitioned by calendar month
//! (UTC) of the result's arrival, and a series' daily rollups (`series_daily`) by their day,
//! so that retention drops whole months instead of deleting rows.
//!
//! `partitions.rs` creates months ahead (at start-up and from the maintenance loop),
//! `retention.rs` is that loop and drops expired months, `points.rs` writes a judged
//! result's series points and rollups in its verdict's transaction, and `range.rs` reads a
//! series over a time range: its points when the range is short, its rollups when long.
//! Nothing here reads or judges figures; `health` does, through these functions.

pub mod partitions;
pub mod points;
pub mod range;
pub mod retention;

pub use range::range;
use uuid::Uuid;

/// One series: a node's figure of one test, metric, size band (`health::figures::size_band`)
/// and world size, and the GPU pair of a per-pair figure (`0-1`, see
/// `heddle_types::health::pair_name`; `""` for a figure without one, as `series_points.pair`
/// and `change_points.pair` store it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, sqlx::FromRow)]
pub struct SeriesKey {
    pub node_id: Uuid,
    pub test: String,
    pub metric: String,
    pub band: i32,
    pub world_size: i32,
    pub pair: String,
}

/// How long history is kept (`HEDDLE_HISTORY_KEEP_DAYS`, `HEDDLE_ROLLUP_KEEP_DAYS`); its
/// home is the configuration, which the history layer reads.
pub use crate::config::HistoryKeep as Keep;
