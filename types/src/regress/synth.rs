//! Synthetic series with known level shifts and outliers, and the score of a detector's
//! answer against them: how the detector's quality in docs/health.md is measured
//! (`heddle regressions generate` and `heddle regressions score`). Deterministic for a
//! seed, with its own small generator so the figures do not move with a dependency.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use super::{ChangePointOut, InputLine};

/// What is generated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    pub series: usize,
    /// Daily points per series.
    pub points: usize,
    pub seed: u64,
    /// The share of series given one step.
    pub step_share: f64,
    /// The chance of any point being a single outlier.
    pub outlier_rate: f64,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            series: 1000,
            points: 90,
            seed: 1,
            step_share: 0.5,
            outlier_rate: 0.02,
        }
    }
}

/// One injected event: a step (the level moves by `relative_change` from `t` on) or a
/// single outlier at `t`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Truth {
    pub series: String,
    pub kind: TruthKind,
    pub t: DateTime<Utc>,
    pub relative_change: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TruthKind {
    Step,
    Outlier,
}

/// SplitMix64 (Steele, Lea & Flood 2014).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u = self.unit().max(f64::MIN_POSITIVE);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// The first day of every generated series.
pub fn start() -> DateTime<Utc> {
    DateTime::from_timestamp(1_785_542_400, 0).unwrap_or_default() // 2026-08-01T00:00:00Z
}

/// Series of daily bandwidths: a level between 20 and 400, Gaussian noise of a CV between
/// 1 % and 3 %, single outliers 15–50 % low (a busy node, a throttled GPU); `step_share`
/// of the series get one step of 3–15 % (down three times in four) at a day between 15 and
/// `points - 15`.
pub fn generate(spec: &Spec) -> (Vec<InputLine>, Vec<Truth>) {
    let mut rng = Rng(spec.seed);
    let mut lines = Vec::with_capacity(spec.series * spec.points);
    let mut truth = Vec::new();
    let day = |i: usize| start() + Duration::days(i64::try_from(i).unwrap_or(i64::MAX));
    for s in 0..spec.series {
        let id = format!("node-{:04}/nccl.all_reduce/busbw_gbs/30", s);
        let level = rng.between(20.0, 400.0);
        let cv = rng.between(0.01, 0.03);
        let step = (rng.unit() < spec.step_share && spec.points >= 30).then(|| {
            let at = 15 + (rng.unit() * (spec.points - 30) as f64) as usize;
            let size = rng.between(0.03, 0.15);
            let sign = if rng.unit() < 0.75 { -1.0 } else { 1.0 };
            (at, sign * size)
        });
        if let Some((at, change)) = step {
            truth.push(Truth {
                series: id.clone(),
                kind: TruthKind::Step,
                t: day(at),
                relative_change: change,
            });
        }
        for i in 0..spec.points {
            let mut mean = level;
            if let Some((_, change)) = step.filter(|(at, _)| i >= *at) {
                mean *= 1.0 + change;
            }
            let mut value = mean * (1.0 + cv * rng.normal());
            if rng.unit() < spec.outlier_rate {
                let drop = rng.between(0.15, 0.5);
                value *= 1.0 - drop;
                truth.push(Truth {
                    series: id.clone(),
                    kind: TruthKind::Outlier,
                    t: day(i),
                    relative_change: -drop,
                });
            }
            lines.push(InputLine {
                series: id.clone(),
                t: day(i),
                value,
            });
        }
    }
    (lines, truth)
}

/// How a detector's change points compare with the truth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Score {
    pub series: usize,
    /// Steps of at least 5 %, and how many were found within `tolerance_days` of their day
    /// with the right sign.
    pub steps_5_to_15: usize,
    pub found_5_to_15: usize,
    pub recall_5_to_15: f64,
    /// Steps of 3–5 % (at or below the noise), the same.
    pub steps_3_to_5: usize,
    pub found_3_to_5: usize,
    pub recall_3_to_5: f64,
    /// Change points that match no step.
    pub false_alarms: usize,
    pub false_alarms_per_100_series: f64,
    /// Single outliers, and those with no change point within `tolerance_days`.
    pub outliers: usize,
    pub outliers_silent: usize,
    /// Found steps: the mean of |reported - true relative change| (percentage points).
    pub mean_abs_size_error_pp: f64,
    pub tolerance_days: i64,
}

pub fn score(truth: &[Truth], found: &[ChangePointOut], series: usize) -> Score {
    const TOLERANCE: i64 = 2;
    let near = |a: DateTime<Utc>, b: DateTime<Utc>| (a - b).num_days().abs() <= TOLERANCE;
    let mut by_series: BTreeMap<&str, Vec<&ChangePointOut>> = BTreeMap::new();
    for c in found {
        by_series.entry(c.series.as_str()).or_default().push(c);
    }
    let mut matched: std::collections::HashSet<(&str, DateTime<Utc>)> = Default::default();
    let (mut steps_big, mut found_big, mut steps_small, mut found_small) = (0, 0, 0, 0);
    let mut size_errors = Vec::new();
    for t in truth.iter().filter(|t| t.kind == TruthKind::Step) {
        let hit = by_series.get(t.series.as_str()).and_then(|cs| {
            cs.iter().find(|c| {
                near(c.t, t.t) && c.relative_change.signum() == t.relative_change.signum()
            })
        });
        if let Some(c) = hit {
            matched.insert((c.series.as_str(), c.t));
            size_errors.push((c.relative_change - t.relative_change).abs() * 100.0);
        }
        if t.relative_change.abs() >= 0.05 {
            steps_big += 1;
            found_big += usize::from(hit.is_some());
        } else {
            steps_small += 1;
            found_small += usize::from(hit.is_some());
        }
    }
    let false_alarms = found
        .iter()
        .filter(|c| !matched.contains(&(c.series.as_str(), c.t)))
        .count();
    let outliers: Vec<&Truth> = truth
        .iter()
        .filter(|t| t.kind == TruthKind::Outlier)
        .collect();
    let silent = outliers
        .iter()
        .filter(|o| {
            !by_series.get(o.series.as_str()).is_some_and(|cs| {
                cs.iter()
                    .any(|c| near(c.t, o.t) && !matched.contains(&(c.series.as_str(), c.t)))
            })
        })
        .count();
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Score {
        series,
        steps_5_to_15: steps_big,
        found_5_to_15: found_big,
        recall_5_to_15: ratio(found_big, steps_big),
        steps_3_to_5: steps_small,
        found_3_to_5: found_small,
        recall_3_to_5: ratio(found_small, steps_small),
        false_alarms,
        false_alarms_per_100_series: ratio(false_alarms * 100, series),
        outliers: outliers.len(),
        outliers_silent: silent,
        mean_abs_size_error_pp: if size_errors.is_empty() {
            0.0
        } else {
            size_errors.iter().sum::<f64>() / size_errors.len() as f64
        },
        tolerance_days: TOLERANCE,
    }
}
