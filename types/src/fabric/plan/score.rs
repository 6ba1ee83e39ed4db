//! The likelihood of the evidence under each component being the fault, and the greedy
//! explanation of the failures by at most [`MAX_FAULTS`] components.

use std::collections::HashMap;

use super::Planner;
use crate::fabric::index::{Index, Kind};

/// How often a test over healthy components fails anyway.
pub const NOISE: f64 = 0.01;
/// The most faults one investigation explains its failures by.
pub const MAX_FAULTS: usize = 3;
/// A hard fault spoils this fraction of the tests crossing it, an intermittent one this
/// fraction; a fault is hard with probability `HARD_WEIGHT`.
const HARD_Q: f64 = 0.97;
const SOFT_Q: f64 = 0.33;
const HARD_WEIGHT: f64 = 0.75;
/// Prior that the failures a component would explain are noise: small for the first
/// (something made these nodes suspects), larger for each further fault.
const NOISE_FIRST: f64 = 0.02;
const NOISE_MORE: f64 = 0.3;
/// Components within this log-likelihood of a level's best are its candidates.
const WINDOW: f64 = 4.6;
const MAX_WINDOW: usize = 4096;

/// One fault of the explanation.
#[derive(Debug, Clone)]
pub(crate) struct Level {
    pub top: u32,
    /// The top's posterior against every component and noise, on the failures it explains.
    pub confidence: f64,
    /// The best components for those failures, with their posteriors, best first.
    pub alternatives: Vec<(u32, f64)>,
    /// Candidates to tell apart, with their posteriors.
    pub window: Vec<(u32, f64)>,
}

fn log_add(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    let m = a.max(b);
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// Log-likelihood of `f` failing and `p` passing tests crossing a faulty component, less
/// what they would have if it were healthy.
fn gain(f: u32, p: u32) -> f64 {
    let (f, p) = (f as f64, p as f64);
    let hard = HARD_WEIGHT.ln() + f * HARD_Q.ln() + p * (1.0 - HARD_Q).ln();
    let soft = (1.0 - HARD_WEIGHT).ln() + f * SOFT_Q.ln() + p * (1.0 - SOFT_Q).ln();
    log_add(hard, soft) - f * NOISE.ln() - p * (1.0 - NOISE).ln()
}

/// Which components the suspects make likely: their nodes and NICs, the leaves those
/// NICs are cabled to, those leaves' uplinks and spines. Each kind gets an equal share
/// (a fault is as often a NIC or a cable as a node or a leaf); anything else a
/// hundredth of its kind's weight. A node with one NIC is not told apart from it: the NIC
/// is the hypothesis, and its evidence says the node may be it.
pub(crate) fn priors(ix: &Index, suspect: &[bool]) -> (Vec<f64>, Vec<bool>) {
    let mut related = vec![false; ix.comps.len()];
    for (n, node) in ix.nodes.iter().enumerate() {
        if !suspect[n] {
            continue;
        }
        related[ix.node_comp(n as u32) as usize] = true;
        for &k in &node.nics {
            related[ix.nic_comp(k) as usize] = true;
            let leaf = ix.nics[k as usize].leaf as usize;
            if let Some(c) = ix.leaf_comp[leaf] {
                related[c as usize] = true;
            }
            for &(s, up) in &ix.leaf_spines[leaf] {
                related[up as usize] = true;
                if let Some(c) = ix.spine_comp[s as usize] {
                    related[c as usize] = true;
                }
            }
        }
    }
    let kinds = [Kind::Node, Kind::Nic, Kind::Leaf, Kind::Uplink, Kind::Spine];
    let mut count: HashMap<Kind, f64> = HashMap::new();
    for (c, comp) in ix.comps.iter().enumerate() {
        if related[c] {
            *count.entry(comp.kind).or_default() += 1.0;
        }
    }
    let present = kinds
        .iter()
        .filter(|k| count.contains_key(k))
        .count()
        .max(1) as f64;
    let share = (1.0 - NOISE_FIRST) / present;
    let priors = ix
        .comps
        .iter()
        .enumerate()
        .map(|(c, comp)| {
            if comp.kind == Kind::Node && ix.nodes[c].nics.len() == 1 {
                return f64::NEG_INFINITY;
            }
            let n = count.get(&comp.kind).copied().unwrap_or(1.0);
            let w = share / n * if related[c] { 1.0 } else { 0.01 };
            w.ln()
        })
        .collect();
    (priors, related)
}

/// The failures explained greedily: the likeliest component, then the likeliest for what
/// it leaves unexplained, and so on. Empty when nothing failed.
pub(crate) fn explain(p: &Planner) -> Vec<Level> {
    let mut remaining: Vec<usize> = (0..p.done.len()).filter(|&i| p.done[i].failed).collect();
    let mut levels = Vec::new();
    // What each component scores with no failure explained: its prior and its passes.
    let base: Vec<f64> = (0..p.ix.comps.len())
        .map(|c| p.prior[c] + gain(0, p.hit_pass[c]))
        .collect();
    let score = |c: u32, fails: u32| p.prior[c as usize] + gain(fails, p.hit_pass[c as usize]);
    for k in 0..=MAX_FAULTS {
        if remaining.is_empty() {
            break;
        }
        let counts = count(p, &remaining);
        let Some((&top, _)) = counts
            .iter()
            .map(|(c, f)| (c, score(*c, *f)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(a.0)))
        else {
            break;
        };
        let explained: Vec<usize> = remaining
            .iter()
            .copied()
            .filter(|&i| p.done[i].comps.binary_search(&top).is_ok())
            .collect();
        remaining.retain(|i| !explained.contains(i));
        if k == MAX_FAULTS {
            // More failure clusters than faults explained: say so, blame nothing more.
            levels.push(Level {
                top,
                confidence: 0.0,
                alternatives: vec![(top, 0.0)],
                window: vec![(top, 1.0)],
            });
            break;
        }
        // The top against every component (and noise) on the failures it explains.
        let on = count(p, &explained);
        let noise_prior = if k == 0 { NOISE_FIRST } else { NOISE_MORE };
        let scale = ((1.0 - noise_prior) / (1.0 - NOISE_FIRST)).ln();
        let mut z = noise_prior.ln();
        for (c, b) in base.iter().enumerate() {
            if !on.contains_key(&(c as u32)) {
                z = log_add(z, b + scale);
            }
        }
        let mut scored: Vec<(u32, f64)> =
            on.iter().map(|(&c, &f)| (c, score(c, f) + scale)).collect();
        for &(_, s) in &scored {
            z = log_add(z, s);
        }
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let best = scored.first().map_or(f64::NEG_INFINITY, |s| s.1);
        let post = |s: f64| (s - z).exp();
        let confidence = scored
            .iter()
            .find(|s| s.0 == top)
            .map_or(0.0, |s| post(s.1));
        let window = scored
            .iter()
            .take_while(|s| s.1 >= best - WINDOW)
            .take(MAX_WINDOW)
            .map(|s| (s.0, post(s.1)))
            .collect();
        let alternatives = scored.iter().take(8).map(|s| (s.0, post(s.1))).collect();
        levels.push(Level {
            top,
            confidence,
            alternatives,
            window,
        });
    }
    levels
}

/// How many of `tests` each component is on.
fn count(p: &Planner, tests: &[usize]) -> HashMap<u32, u32> {
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &i in tests {
        for &c in &p.done[i].comps {
            *counts.entry(c).or_default() += 1;
        }
    }
    counts
}

/// Whether a component may serve as a known-good part of a test: nothing implicates it
/// and some test, or its being outside the suspects, speaks for it.
pub(crate) fn good(p: &Planner, c: u32) -> bool {
    let (f, s) = (p.hit_fail[c as usize], p.hit_pass[c as usize]);
    (f == 0 && (s > 0 || !p.related[c as usize])) || s >= 4 * f.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_raise_and_passes_lower_a_component() {
        assert!(gain(1, 0) > 3.0);
        assert!(gain(2, 0) > gain(1, 0));
        assert!(gain(0, 1) < -1.5);
        assert!(gain(0, 3) < gain(0, 1));
        // An intermittent fault stays plausible with passes among its failures.
        assert!(gain(2, 4) > 0.0);
        assert!(gain(1, 10) < 0.0);
    }
}
