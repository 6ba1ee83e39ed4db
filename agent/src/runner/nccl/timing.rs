//! How one size is timed.
//!
//! As nccl-tests: `warmup` launches, then the host clock around `iters` launches and a
//! stream sync, divided by `iters` (one sample). With `graph` (nccl-tests' `-G`) the
//! `iters` launches are captured once into a CUDA graph and the graph is replayed `graph`
//! times, which takes the CPU's launch cost out of small sizes. Unless `graph` is given,
//! sizes up to [`GRAPH_MAX_BYTES`] are replayed once from a graph: launched one by one,
//! their figure is the CPU's launch cost of `ncclAllReduce` and friends (5–8 µs on an H100
//! host, varying by a third between runs), not the collective's; `graph: 0` (`-G 0`)
//! times them launch by launch as nccl-tests does by default.
//!
//! With a budget, samples are taken until the figure is stable — at least
//! [`MIN_SAMPLES`], and the 95 % confidence interval of their mean within
//! [`TARGET_CI`] of it — or until this size's share of the budget is spent; the figure is
//! the median sample, and its spread is reported.

use std::time::{Duration, Instant};

use super::engine::{Case, Engine, EngineError};
use super::spec::Counts;

pub const MIN_SAMPLES: usize = 5;
/// Relative half-width of the 95 % confidence interval of the mean that counts as stable.
pub const TARGET_CI: f64 = 0.005;
/// No more samples than this, however unstable.
pub const MAX_SAMPLES: usize = 10_000;
/// Unless told otherwise, sizes up to this are timed as graph replays.
pub const GRAPH_MAX_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub warmup: u64,
    pub iters: u64,
    /// Graph replays per sample (nccl-tests' `-G`); 0 launches one by one; `None`: one
    /// replay up to [`GRAPH_MAX_BYTES`], launches above.
    pub graph: Option<u64>,
    pub check: bool,
}

/// The spread of the samples of an adaptive measurement.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    pub samples: usize,
    /// Collectives timed in all samples together.
    pub timed_iters: u64,
    pub min_us: f64,
    pub max_us: f64,
    /// Standard deviation of the samples over their mean, in percent.
    pub rsd_pct: f64,
}

/// One measurement of one size in one mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub time_us: f64,
    /// Elements that failed validation on this process's ranks; `None` when not checked.
    pub wrong: Option<u64>,
    /// Whether the launches were replayed from a CUDA graph.
    pub graph: bool,
    /// Present when the sample count was chosen by the budget.
    pub spread: Option<Spread>,
}

/// Validates, warms up and times one size. `share` is this size's part of the budget
/// (`None`: one sample, as nccl-tests).
pub fn measure(
    engine: &Engine,
    k: &Case,
    c: &Counts,
    in_place: bool,
    s: &Settings,
    share: Option<Duration>,
) -> Result<Timing, EngineError> {
    let wrong = engine.validate(k, c, in_place, s.check)?;
    for i in 0..s.warmup {
        engine.launch(k, c, in_place, i)?;
    }
    engine.sync()?;
    let iters = s.iters.max(1);
    let replays = replays(s.graph, c.bytes);
    let graphs = if replays > 0 {
        let g = engine.capture(k, c, in_place, iters)?;
        // Once untimed: the first launch of a graph uploads it.
        engine.replay(&g)?;
        engine.sync()?;
        Some(g)
    } else {
        None
    };
    let sample = || -> Result<f64, EngineError> {
        let start = Instant::now();
        match &graphs {
            Some(g) => {
                for _ in 0..replays {
                    engine.replay(g)?;
                }
            }
            None => {
                for i in 0..iters {
                    engine.launch(k, c, in_place, i)?;
                }
            }
        }
        engine.sync()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / (iters * replays.max(1)) as f64)
    };
    let (time_us, spread) = match share {
        None => (sample()?, None),
        Some(share) => {
            let start = Instant::now();
            let mut samples = Vec::new();
            loop {
                samples.push(sample()?);
                if stable(&samples) || start.elapsed() >= share || samples.len() >= MAX_SAMPLES {
                    break;
                }
            }
            let spread = spread(&samples, iters * replays.max(1));
            (median(&mut samples), Some(spread))
        }
    };
    Ok(Timing {
        time_us,
        wrong,
        graph: graphs.is_some(),
        spread,
    })
}

/// Graph replays per sample for a size: what was asked, else one up to
/// [`GRAPH_MAX_BYTES`] and none above.
pub fn replays(graph: Option<u64>, bytes: u64) -> u64 {
    match graph {
        Some(g) => g,
        None if bytes <= GRAPH_MAX_BYTES => 1,
        None => 0,
    }
}

fn mean_sd(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    if x.len() < 2 {
        return (mean, 0.0);
    }
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// At least [`MIN_SAMPLES`] and a 95 % confidence interval of the mean within
/// [`TARGET_CI`] of it.
pub fn stable(samples: &[f64]) -> bool {
    if samples.len() < MIN_SAMPLES {
        return false;
    }
    let (mean, sd) = mean_sd(samples);
    mean > 0.0 && 1.96 * sd / (samples.len() as f64).sqrt() <= TARGET_CI * mean
}

pub fn spread(samples: &[f64], iters_per_sample: u64) -> Spread {
    let (mean, sd) = mean_sd(samples);
    Spread {
        samples: samples.len(),
        timed_iters: samples.len() as u64 * iters_per_sample,
        min_us: samples.iter().cloned().fold(f64::INFINITY, f64::min),
        max_us: samples.iter().cloned().fold(0.0, f64::max),
        rsd_pct: if mean > 0.0 { 100.0 * sd / mean } else { 0.0 },
    }
}

pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => samples[n / 2],
        _ => (samples[n / 2 - 1] + samples[n / 2]) / 2.0,
    }
}

/// This measurement's share of what is left of the budget: the rest divided evenly among
/// the measurements still to come, so sizes that settle early leave time to the others.
pub fn share(budget: Duration, spent: Duration, remaining: usize) -> Duration {
    budget.saturating_sub(spent) / remaining.max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stability_needs_enough_samples_and_a_tight_interval() {
        assert!(!stable(&[10.0; 4]));
        assert!(stable(&[10.0; 5]));
        // 10 % noise: not stable after 5 samples, stable after many.
        let noisy: Vec<f64> = (0..6)
            .map(|i| if i % 2 == 0 { 9.0 } else { 11.0 })
            .collect();
        assert!(!stable(&noisy));
        let many: Vec<f64> = (0..2000)
            .map(|i| if i % 2 == 0 { 9.0 } else { 11.0 })
            .collect();
        assert!(stable(&many));
        assert!(!stable(&[0.0; 10]));
    }

    #[test]
    fn small_sizes_replay_a_graph_unless_told() {
        assert_eq!(replays(None, 8), 1);
        assert_eq!(replays(None, GRAPH_MAX_BYTES), 1);
        assert_eq!(replays(None, GRAPH_MAX_BYTES + 1), 0);
        assert_eq!(replays(Some(0), 8), 0);
        assert_eq!(replays(Some(3), 8 << 30), 3);
    }

    #[test]
    fn spread_and_median() {
        let mut s = vec![4.0, 1.0, 3.0, 2.0];
        let sp = spread(&s, 20);
        assert_eq!(
            (sp.samples, sp.timed_iters, sp.min_us, sp.max_us),
            (4, 80, 1.0, 4.0)
        );
        // Sample standard deviation of 1..4 is 1.29; the mean is 2.5.
        assert!((sp.rsd_pct - 51.639_777).abs() < 1e-3, "{}", sp.rsd_pct);
        assert_eq!(median(&mut s), 2.5);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(spread(&[5.0], 1).rsd_pct, 0.0);
    }

    #[test]
    fn the_budget_left_is_shared_among_the_measurements_to_come() {
        let b = Duration::from_secs(10);
        assert_eq!(share(b, Duration::ZERO, 4), Duration::from_millis(2500));
        assert_eq!(share(b, Duration::from_secs(8), 2), Duration::from_secs(1));
        assert_eq!(share(b, Duration::from_secs(12), 2), Duration::ZERO);
        assert_eq!(share(b, Duration::ZERO, 0), b);
    }
}
