//! Level shifts in one series of measurements: where the typical value moved and stayed.
//!
//! The segmentation is PELT (Killick, Fearnhead & Eckley, "Optimal detection of
//! changepoints with a linear computational cost", JASA 2012) with the L1 cost (the sum of
//! absolute deviations from the segment's median, i.e. the negative log-likelihood of a
//! Laplace model), which one outlier moves by its distance only, not its square. Costs are
//! measured in units of the series' noise (`estimate::noise_sd`), so one penalty fits
//! series of any scale, and a segment holds at least `min_points` points, so a single
//! outlier can never be a segment of its own.
//!
//! PELT finds where a segmentation pays for itself; each boundary it keeps must then show a
//! change people care about: the medians either side differ by at least `min_effect`, and
//! the Hodges–Lehmann 95 % interval of the shift excludes zero. A boundary that fails is
//! removed and its neighbours are compared again (weakest first), so what remains are
//! boundaries between segments that really differ.

use super::estimate::{self, Z_95};

/// How the detector decides; defaults in [`Config::default`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// The smallest relative change of the median reported (0.03: 3 %).
    pub min_effect: f64,
    /// Points needed on each side of a change.
    pub min_points: usize,
    /// The price of one more change, in noise units per ln(n) (a BIC-like penalty).
    pub penalty: f64,
}

/// The defaults of docs/health.md ("Regressions").
pub const DEFAULT_MIN_EFFECT: f64 = 0.03;
pub const DEFAULT_MIN_POINTS: usize = 5;
pub const DEFAULT_PENALTY: f64 = 3.0;
/// Only the newest this many points of a series are looked at: the work grows with the cube
/// of the series' length (every segment's cost): 14 ms at this length in a release build.
pub const MAX_POINTS: usize = 512;

impl Default for Config {
    fn default() -> Self {
        Config {
            min_effect: DEFAULT_MIN_EFFECT,
            min_points: DEFAULT_MIN_POINTS,
            penalty: DEFAULT_PENALTY,
        }
    }
}

/// One level shift.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    /// Index into the input of the first point after the change.
    pub index: usize,
    /// Medians of the segments before and after.
    pub before: f64,
    pub after: f64,
    /// `(after - before) / before`.
    pub relative_change: f64,
    /// The Hodges–Lehmann shift relative to `before`, with its 95 % interval.
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
    pub points_before: usize,
    pub points_after: usize,
    /// Points before that are nearer the old median than the new, and points after nearer
    /// the new: each must be at least `min_points`, so that a few points at a segment's
    /// edge cannot make a change of their own.
    pub on_old_level: usize,
    pub on_new_level: usize,
}

/// The level shifts of `values` in order of time (the input's order). Non-finite values are
/// skipped; only the last [`MAX_POINTS`] finite ones are looked at. Never panics.
pub fn detect(values: &[f64], cfg: &Config) -> Vec<Change> {
    let mut index: Vec<usize> = (0..values.len())
        .filter(|&i| values[i].is_finite())
        .collect();
    if index.len() > MAX_POINTS {
        index.drain(..index.len() - MAX_POINTS);
    }
    let x: Vec<f64> = index.iter().map(|&i| values[i]).collect();
    let min_points = cfg.min_points.max(1);
    if x.len() < 2 * min_points {
        return Vec::new();
    }
    let boundaries = pelt(&x, min_points, cfg.penalty);
    confirm(&x, boundaries, cfg)
        .into_iter()
        .map(|c| Change {
            index: index[c.index],
            ..c
        })
        .collect()
}

/// The optimal segmentation's boundaries (indices of first points of new segments).
fn pelt(x: &[f64], min_points: usize, penalty: f64) -> Vec<usize> {
    let n = x.len();
    // Scaled into [-1, 1] so no sum overflows; costs are then in units of the noise, floored
    // so that a noiseless series costs finitely.
    let top = x.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
    let scale = if top > 0.0 { top } else { 1.0 };
    let y: Vec<f64> = x.iter().map(|v| v / scale).collect();
    let sd = estimate::noise_sd(&y).max(1e-9);
    // Laplace scale b = sd / √2: the cost of a segment is Σ|y - median| / b.
    let b = sd / std::f64::consts::SQRT_2;
    let costs = SegmentCosts::new(&y, min_points);
    let beta = if penalty.is_finite() && penalty > 0.0 {
        penalty * (n as f64).ln()
    } else {
        DEFAULT_PENALTY * (n as f64).ln()
    };
    let mut f = vec![f64::INFINITY; n + 1];
    let mut last = vec![0usize; n + 1];
    f[0] = -beta;
    let mut candidates: Vec<usize> = vec![0];
    for t in min_points..=n {
        if t >= 2 * min_points {
            // The newest admissible start: a segment ending at t - min_points exists.
            candidates.push(t - min_points);
        }
        let mut best = f64::INFINITY;
        let mut arg = 0;
        let mut totals = Vec::with_capacity(candidates.len());
        for &s in &candidates {
            let total = f[s] + costs.get(s, t) / b + beta;
            totals.push(total);
            if total < best {
                best = total;
                arg = s;
            }
        }
        f[t] = best;
        last[t] = arg;
        // PELT's pruning (the L1 cost's K = 0): a start that already costs more than the
        // optimum can never be the last change of a later optimum.
        let mut keep = totals.iter().map(|total| total - beta <= best);
        candidates.retain(|_| keep.next().unwrap_or(true));
    }
    let mut out = Vec::new();
    let mut t = n;
    while t > 0 && f[t].is_finite() {
        let s = last[t];
        if s == 0 {
            break;
        }
        out.push(s);
        t = s;
    }
    out.reverse();
    out
}

/// The L1 cost of every segment `[s, t)` of at least `min_points` points: the sum of
/// absolute deviations from its median (upper half's sum minus lower half's, on a sorted
/// copy kept as the segment grows).
struct SegmentCosts {
    n: usize,
    cost: Vec<f64>,
}

impl SegmentCosts {
    fn new(y: &[f64], min_points: usize) -> Self {
        let n = y.len();
        let mut cost = vec![f64::INFINITY; (n + 1) * (n + 1)];
        let mut sorted: Vec<f64> = Vec::with_capacity(n);
        for s in 0..n {
            sorted.clear();
            for t in s..n {
                let at = sorted.partition_point(|v| *v < y[t]);
                sorted.insert(at, y[t]);
                let len = sorted.len();
                if len < min_points {
                    continue;
                }
                let half = len / 2;
                let lower: f64 = sorted[..half].iter().sum();
                let upper: f64 = sorted[len - half..].iter().sum();
                cost[s * (n + 1) + t + 1] = upper - lower;
            }
        }
        SegmentCosts { n, cost }
    }

    fn get(&self, s: usize, t: usize) -> f64 {
        self.cost[s * (self.n + 1) + t]
    }
}

/// Keeps the boundaries whose neighbouring segments differ by at least `min_effect` with a
/// Hodges–Lehmann interval that excludes zero, removing the weakest failing one at a time.
fn confirm(x: &[f64], mut bounds: Vec<usize>, cfg: &Config) -> Vec<Change> {
    loop {
        let mut edges = Vec::with_capacity(bounds.len() + 2);
        edges.push(0);
        edges.extend(&bounds);
        edges.push(x.len());
        let judged: Vec<Option<Change>> = (1..edges.len() - 1)
            .map(|i| compare(x, edges[i - 1], edges[i], edges[i + 1]))
            .collect();
        let min_points = cfg.min_points.max(1);
        let failing = judged.iter().enumerate().filter_map(|(i, c)| match c {
            Some(c)
                if c.relative_change.abs() >= cfg.min_effect
                    && c.low * c.high > 0.0
                    && c.on_old_level >= min_points
                    && c.on_new_level >= min_points =>
            {
                None
            }
            Some(c) => Some((i, c.relative_change.abs())),
            None => Some((i, -1.0)),
        });
        match failing.min_by(|a, b| a.1.total_cmp(&b.1)) {
            Some((weakest, _)) => {
                bounds.remove(weakest);
            }
            None => return judged.into_iter().flatten().collect(),
        }
    }
}

/// The change between `x[a..b]` and `x[b..c]`; `None` when it cannot be relative (a median
/// of zero, or not finite).
fn compare(x: &[f64], a: usize, b: usize, c: usize) -> Option<Change> {
    let (left, right) = (&x[a..b], &x[b..c]);
    let before = estimate::median(left)?;
    let after = estimate::median(right)?;
    if before == 0.0 {
        return None;
    }
    let relative_change = (after - before) / before.abs();
    let hl = estimate::hodges_lehmann(left, right, Z_95)?;
    let rel = |v: f64| v / before.abs();
    let change = Change {
        index: b,
        before,
        after,
        relative_change,
        estimate: rel(hl.estimate),
        low: rel(hl.low),
        high: rel(hl.high),
        points_before: left.len(),
        points_after: right.len(),
        on_old_level: left
            .iter()
            .filter(|v| (*v - before).abs() < (*v - after).abs())
            .count(),
        on_new_level: right
            .iter()
            .filter(|v| (*v - after).abs() < (*v - before).abs())
            .count(),
    };
    [change.relative_change, change.low, change.high]
        .iter()
        .all(|v| v.is_finite())
        .then_some(change)
}
