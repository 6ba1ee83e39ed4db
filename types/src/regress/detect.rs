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
/// Only the newest this many points of a series are looked at. Each step extends the
/// segment of every start PELT still keeps by one point (O(log n) each), so the work grows
/// with the series' length times the starts kept: at most quadratic, and about linear
/// where changes prune the starts.
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
    let beta = if penalty.is_finite() && penalty > 0.0 {
        penalty * (n as f64).ln()
    } else {
        DEFAULT_PENALTY * (n as f64).ln()
    };
    let mut f = vec![f64::INFINITY; n + 1];
    let mut last = vec![0usize; n + 1];
    f[0] = -beta;
    // Each start still in play, with its segment's points so far: a segment grows by one
    // point a step, and a pruned start's segment is dropped with it, so the work follows
    // the candidates PELT keeps, not every segment of the series.
    let mut candidates: Vec<Segment> = vec![Segment::new(0)];
    for t in min_points..=n {
        if t >= 2 * min_points {
            // The newest admissible start: a segment ending at t - min_points exists.
            candidates.push(Segment::new(t - min_points));
        }
        let mut best = f64::INFINITY;
        let mut arg = 0;
        let mut totals = Vec::with_capacity(candidates.len());
        for seg in &mut candidates {
            seg.extend_to(&y, t);
            let total = f[seg.start] + seg.cost() / b + beta;
            totals.push(total);
            if total < best {
                best = total;
                arg = seg.start;
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

/// An `f64` ordered by `total_cmp`, for the heaps below (the series holds finite values
/// only).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The points `[start, end)` of a segment that grows at its end, with its L1 cost (the sum of
/// absolute deviations from its median: the upper half's sum minus the lower half's) kept
/// up to date in O(log n) a point: the lower half in a max-heap (with the median when the
/// count is odd), the upper half in a min-heap, and each half's sum.
#[derive(Debug)]
struct Segment {
    start: usize,
    end: usize,
    lower: std::collections::BinaryHeap<Ordered>,
    upper: std::collections::BinaryHeap<std::cmp::Reverse<Ordered>>,
    lower_sum: f64,
    upper_sum: f64,
}

impl Segment {
    fn new(start: usize) -> Self {
        Segment {
            start,
            end: start,
            lower: Default::default(),
            upper: Default::default(),
            lower_sum: 0.0,
            upper_sum: 0.0,
        }
    }

    /// Adds the points up to `end` (exclusive).
    fn extend_to(&mut self, y: &[f64], end: usize) {
        while self.end < end {
            self.push(y[self.end]);
            self.end += 1;
        }
    }

    fn push(&mut self, v: f64) {
        // Into the lower half, its largest over to the upper half, and back when the upper
        // half would be the larger.
        self.lower.push(Ordered(v));
        self.lower_sum += v;
        let top = self.lower.pop().expect("just pushed").0;
        self.lower_sum -= top;
        self.upper.push(std::cmp::Reverse(Ordered(top)));
        self.upper_sum += top;
        if self.upper.len() > self.lower.len() {
            let low = self.upper.pop().expect("not empty").0.0;
            self.upper_sum -= low;
            self.lower.push(Ordered(low));
            self.lower_sum += low;
        }
    }

    fn cost(&self) -> f64 {
        // An odd count's median is the lower heap's top and counts in neither half.
        let lower = if self.lower.len() > self.upper.len() {
            self.lower_sum - self.lower.peek().map_or(0.0, |m| m.0)
        } else {
            self.lower_sum
        };
        self.upper_sum - lower
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

#[cfg(test)]
mod segment_tests {
    use super::*;
    use proptest::prelude::*;

    /// The L1 cost the direct way: sort, then the upper half's sum minus the lower half's.
    fn direct(points: &[f64]) -> f64 {
        let mut v = points.to_vec();
        v.sort_by(f64::total_cmp);
        let half = v.len() / 2;
        v[v.len() - half..].iter().sum::<f64>() - v[..half].iter().sum::<f64>()
    }

    proptest! {
        #[test]
        fn a_growing_segment_costs_what_its_points_cost(
            y in proptest::collection::vec(-1.0..1.0f64, 1..200),
            start in 0usize..50,
        ) {
            let start = start.min(y.len() - 1);
            let mut seg = Segment::new(start);
            for end in start + 1..=y.len() {
                seg.extend_to(&y, end);
                let want = direct(&y[start..end]);
                prop_assert!((seg.cost() - want).abs() < 1e-9, "{} vs {want}", seg.cost());
            }
        }
    }

    #[test]
    fn the_longest_series_with_and_without_a_change() {
        // A series with no change keeps many starts; one with a change prunes them. The
        // time is printed for docs/benchmarks.md, not judged.
        let flat: Vec<f64> = (0..MAX_POINTS)
            .map(|i| 100.0 + ((i * 7919) % 13) as f64 * 0.1)
            .collect();
        let started = std::time::Instant::now();
        assert!(detect(&flat, &Config::default()).is_empty());
        let mut step = flat.clone();
        for v in &mut step[MAX_POINTS / 2..] {
            *v *= 0.9;
        }
        assert_eq!(detect(&step, &Config::default()).len(), 1);
        eprintln!("two series of {MAX_POINTS} points: {:?}", started.elapsed());
    }
}
