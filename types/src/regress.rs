//! Regressions: a node's figure that moved to a new level and stayed there ("it was faster
//! last month"). A *series* is one node's figure of one test, metric, size band and world
//! size (and GPU pair, for a p2p figure of one pair) over time; [`detect`] finds its level shifts (PELT with a robust cost, confirmed by
//! a Hodges–Lehmann interval; docs/health.md, "Regressions"). The server runs it on every
//! stored figure's series and ties each change to the node's facts and the fleet; `heddle
//! regressions detect` runs it offline on JSON lines.

pub mod chart;
pub mod detect;
pub mod estimate;
pub mod facts_diff;
pub mod input;
pub mod synth;

#[cfg(test)]
mod tests;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use chart::{ChartPoint, FactsMarker, MAX_CHART_POINTS, RAW_MAX_DAYS, Resolution, SeriesChart};
pub use detect::{Change, Config, detect};

/// The expectation metric that sets the smallest change reported for a test (a fraction,
/// e.g. 0.05), in place of [`detect::DEFAULT_MIN_EFFECT`].
pub const MIN_CHANGE_METRIC: &str = "regression_min_change";

/// The verdict reason's code of a node's open regression.
pub const REGRESSION_CODE: &str = "regression";

/// One line of the offline detector's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputLine {
    pub series: String,
    pub t: DateTime<Utc>,
    pub value: f64,
}

/// One change the offline detector reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangePointOut {
    pub series: String,
    /// The first point after the change.
    pub t: DateTime<Utc>,
    /// Medians of the points before and after.
    pub before: f64,
    pub after: f64,
    pub relative_change: f64,
    /// The 95 % interval of the relative change (Hodges–Lehmann).
    pub ci_low: f64,
    pub ci_high: f64,
    pub points_before: usize,
    pub points_after: usize,
}

/// `heddle regressions detect --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DetectOutput {
    pub change_points: Vec<ChangePointOut>,
}

/// The change points of every series of an input, by series id then time.
pub fn detect_all(series: &input::Series, cfg: &Config) -> Vec<ChangePointOut> {
    let mut out = Vec::new();
    for (id, points) in series {
        let values: Vec<f64> = points.iter().map(|p| p.1).collect();
        for c in detect(&values, cfg) {
            out.push(ChangePointOut {
                series: id.clone(),
                t: points[c.index].0,
                before: c.before,
                after: c.after,
                relative_change: c.relative_change,
                ci_low: c.low,
                ci_high: c.high,
                points_before: c.points_before,
                points_after: c.points_after,
            });
        }
    }
    out
}

/// Whether a change of `relative_change` in `metric` is for the worse (latencies, `*_us`,
/// are lower-is-better).
pub fn is_worse(metric: &str, relative_change: f64) -> bool {
    if metric.ends_with("_us") {
        relative_change > 0.0
    } else {
        relative_change < 0.0
    }
}

/// One field of a node's facts (or a variable of its applied environment, `env.<NAME>`)
/// that differs between before and after a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FactChange {
    /// `software.nvidia_driver`, `host.kernel`, `env.NCCL_ALGO`, ...
    pub field: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// A facts change several nodes share, and how the fleet split on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SharedChange {
    pub change: FactChange,
    /// Nodes that moved the same way at the same time, and how many of them had this change.
    pub moved_with_change: i64,
    pub moved: i64,
    /// Comparable nodes that did not move, and how many of them had this change anyway.
    pub unmoved_with_change: i64,
    pub unmoved: i64,
}

/// The fleet around one change: comparable nodes (same test, metric, size band and world
/// size, with figures on both sides) and which of them moved the same way within
/// [`FLEET_WINDOW_DAYS`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetView {
    pub compared: i64,
    /// Nodes (this one included) with a change the same way in the window.
    pub moved: i64,
    /// Up to 20 of their hostnames.
    pub moved_nodes: Vec<String>,
    /// The smallest and largest relative change among them.
    pub moved_low: Option<f64>,
    pub moved_high: Option<f64>,
    /// This node's facts changes, each with how the fleet split on it.
    pub shared: Vec<SharedChange>,
}

/// Other nodes' changes count as "the same time" within this many days of this one.
pub const FLEET_WINDOW_DAYS: i64 = 3;

/// A stored change point of a node's series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Regression {
    pub id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    /// `nccl.all_reduce`, `rdma.ib_write_bw`, ...
    pub test: String,
    pub metric: String,
    /// The power of two the figures' message size falls in.
    pub size_band: i32,
    pub world_size: i32,
    /// The copy of a per-pair series (`p2p`: `0-1`, GPU 0 to GPU 1; see
    /// [`crate::health::pair_name`]); absent for a series of a result's judged figure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<String>,
    /// When the first result after the change was received.
    pub t: DateTime<Utc>,
    pub before: f64,
    pub after: f64,
    pub relative_change: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub points_before: i32,
    pub points_after: i32,
    /// A change for the worse (lower bandwidth, higher latency).
    pub worse: bool,
    /// Open: a change for the worse that is still the latest change of its series.
    pub open: bool,
    /// What changed on the node between the results either side.
    pub facts_changes: Vec<FactChange>,
    pub fleet: FleetView,
    /// One sentence for people.
    pub summary: String,
    pub detected_at: DateTime<Utc>,
}

/// The sentence a regression is shown with.
pub fn summary(r: &Regression) -> String {
    let pct = |v: f64| format!("{:+.1} %", v * 100.0);
    let pair = r
        .pair
        .as_deref()
        .map(|p| format!("pair {p}, "))
        .unwrap_or_default();
    let mut s = format!(
        "{} {} {} {} ({pair}band 2^{}, {} node{}): {:.2} → {:.2} ({}, 95 % CI {} to {}) from {}",
        r.hostname,
        if r.worse {
            "regressed on"
        } else {
            "improved on"
        },
        r.test,
        r.metric,
        r.size_band,
        r.world_size,
        if r.world_size == 1 { "" } else { "s" },
        r.before,
        r.after,
        pct(r.relative_change),
        pct(r.ci_low),
        pct(r.ci_high),
        r.t.format("%Y-%m-%d %H:%M UTC"),
    );
    if r.facts_changes.is_empty() {
        s.push_str("; no facts changed on the node around it");
    } else {
        let list: Vec<String> = r.facts_changes.iter().map(change_text).collect();
        s.push_str(&format!("; the node changed {}", list.join(", ")));
    }
    let f = &r.fleet;
    if let (Some(lo), Some(hi)) = (f.moved_low, f.moved_high)
        && f.moved > 1
    {
        s.push_str(&format!(
            "; {} of {} comparable nodes moved the same way ({} to {})",
            f.moved,
            f.compared,
            pct(lo),
            pct(hi)
        ));
    }
    if let Some(best) = f.shared.iter().max_by_key(|c| c.moved_with_change) {
        s.push_str(&format!(
            "; {} of {} that moved had {}, {} of {} that did not move had it",
            best.moved_with_change,
            best.moved,
            change_text(&best.change),
            best.unmoved_with_change,
            best.unmoved
        ));
    }
    s
}

fn change_text(c: &FactChange) -> String {
    format!("{} {}", c.field, values_text(c))
}

fn values_text(c: &FactChange) -> String {
    let v = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
    format!("{} → {}", v(&c.before), v(&c.after))
}

/// A change as people name it: `driver 550.54.15 → 560.28.03`, `mlx5_0 firmware 28.39 → 28.41`.
pub fn change_label(c: &FactChange) -> String {
    format!("{} {}", facts_diff::label(&c.field), values_text(c))
}

/// The fleet around a change in words, for the dashboard: how many comparable nodes moved
/// the same way, what those that moved share, and how many without it moved anyway ("12 of
/// 52 comparable nodes moved the same way (-8.1 % to -6.0 %); all 12 had driver 550.54.15 →
/// 560.28.03; 0 of the 40 without it moved"); of a node that moved alone, how many of the
/// others had its change too.
pub fn fleet_text(f: &FleetView) -> String {
    let pct = |v: f64| format!("{:+.1} %", v * 100.0);
    let mut parts = Vec::new();
    match (f.moved_low, f.moved_high) {
        // A change for the worse counts its own node; improvements get no fleet view.
        _ if f.compared == 0 => parts.push("no fleet view (changes for the worse get one)".into()),
        _ if f.compared == 1 => parts.push("no comparable node to compare with".into()),
        (Some(lo), Some(hi)) if f.moved > 1 => parts.push(format!(
            "{} of {} comparable nodes moved the same way ({} to {})",
            f.moved,
            f.compared,
            pct(lo),
            pct(hi)
        )),
        _ => parts.push(format!(
            "none of the {} other comparable nodes moved",
            f.compared - 1
        )),
    }
    // Sorted most telling first (shared by the most that moved, the fewest that did not).
    match f.shared.first() {
        Some(best) if best.moved > 1 => {
            let label = change_label(&best.change);
            if best.moved_with_change == best.moved {
                parts.push(format!("all {} had {label}", best.moved));
            } else {
                parts.push(format!(
                    "{} of the {} had {label}",
                    best.moved_with_change, best.moved
                ));
            }
            let moved_without = best.moved - best.moved_with_change;
            let without = moved_without + best.unmoved - best.unmoved_with_change;
            parts.push(format!("{moved_without} of the {without} without it moved"));
        }
        Some(best) if best.unmoved > 0 => parts.push(format!(
            "{} of them had {} too",
            best.unmoved_with_change,
            change_label(&best.change)
        )),
        _ => {}
    }
    parts.join("; ")
}
