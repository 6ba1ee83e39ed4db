//! The investigation planner: from suspect nodes and the fabric, each round's tests, and
//! from their results which components are at fault, how sure it is, and why.
//!
//! Every component a test can blame is a hypothesis ([`super::index::Comp`]). A test fails
//! when it hangs or its bus bandwidth falls below [`SLOW_FRACTION`] of what tests of the
//! investigation usually get for their path's rate. A faulty component spoils the tests
//! crossing it — every one (a hard fault) or some (an intermittent one: the likelihood is a
//! mixture of both) — and a healthy one fails a test only by noise ([`NOISE`]). The
//! evidence is explained greedily: the most likely component, the failures it explains,
//! then the most likely for the failures left, up to [`MAX_FAULTS`]; each is *blamed* when
//! its posterior, against every other component and against noise on those failures, is at
//! least the confidence asked for. Tests are then chosen ([`design`]) to split what is
//! still plausible: under each leaf, candidate NICs in pairs or with known-good partners;
//! between leaves, candidate uplinks with known-good leaves; a round's tests share no NIC
//! and no leaf's uplinks, and use at most `max_nodes` nodes.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::index::{Index, Kind};
use super::sim::{Answer, Blame, DEFAULT_SECONDS, RoundRequest, RoundResults};

mod design;
mod score;

pub use score::{MAX_FAULTS, NOISE};

/// A test slower than this fraction of the investigation's reference has failed.
pub const SLOW_FRACTION: f64 = 0.7;

#[derive(Debug, Clone)]
pub struct Config {
    /// The most nodes one round may take (0: no limit).
    pub max_nodes: usize,
    pub max_rounds: u32,
    /// The posterior a component needs to be blamed.
    pub confidence: f64,
    /// Whether nodes outside the suspects may serve as known-good partners.
    pub use_others: bool,
    /// Rounds run before the planner may stop: each component is tested this many times,
    /// so an intermittent fault elsewhere gets its chances to show.
    pub min_rounds: u32,
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_nodes: 0,
            max_rounds: 20,
            confidence: 0.95,
            use_others: true,
            min_rounds: 3,
            seed: 1,
        }
    }
}

/// The most observed jobs one investigation takes as evidence.
pub const MAX_OBSERVATIONS: usize = 100_000;

/// A job seen before the investigation (its communicator's nodes and bandwidth): evidence
/// the planner starts from, as if it were a test it had run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub nodes: Vec<String>,
    /// The rail its communicator used; `None`: every rail.
    #[serde(default)]
    pub rail: Option<u32>,
    #[serde(default)]
    pub busbw_gbs: Option<f64>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub label: Option<String>,
}

/// A test whose result came back.
#[derive(Debug, Clone)]
pub(crate) struct Done {
    pub id: String,
    pub round: u32,
    pub nodes: Vec<u32>,
    pub rail: Option<u32>,
    pub comps: Vec<u32>,
    pub failed: bool,
    /// Bus bandwidth over the path's nominal rate (GB/s); `None` for an error.
    pub ratio: Option<f64>,
    pub busbw: Option<f64>,
    pub error: Option<String>,
}

struct Pending {
    nodes: Vec<u32>,
    rail: Option<u32>,
    comps: Vec<u32>,
    nominal: f64,
}

pub struct Planner<'a> {
    pub(crate) ix: &'a Index,
    pub(crate) cfg: Config,
    /// Log prior of each component being the fault.
    pub(crate) prior: Vec<f64>,
    /// Components the suspects make likely (their nodes, NICs, leaves, uplinks, spines).
    pub(crate) related: Vec<bool>,
    pub(crate) suspect: Vec<bool>,
    /// Failing and passing tests each component is on.
    pub(crate) hit_fail: Vec<u32>,
    pub(crate) hit_pass: Vec<u32>,
    pub(crate) done: Vec<Done>,
    pending: HashMap<String, Pending>,
    round: u32,
    next_id: u64,
    node_seconds: f64,
    max_planning_ms: f64,
    finished: Option<String>,
    notes: Vec<String>,
}

impl<'a> Planner<'a> {
    /// A planner over `suspects` (node names of the fabric). Nodes the fabric does not map
    /// are left out, each with a note.
    pub fn new(ix: &'a Index, suspects: &[String], cfg: Config) -> Result<Planner<'a>, String> {
        let mut suspect = vec![false; ix.nodes.len()];
        let mut notes = Vec::new();
        for s in suspects {
            match ix.node(s) {
                Some(n) => suspect[n as usize] = true,
                None => match ix.unmapped.iter().find(|(n, _)| n == s) {
                    Some((_, why)) => notes.push(format!("{s}: left out ({why})")),
                    None => notes.push(format!("{s}: not in the fabric, left out")),
                },
            }
        }
        if !suspect.iter().any(|&s| s) {
            return Err("no suspect is a node of the fabric".into());
        }
        let (prior, related) = score::priors(ix, &suspect);
        let n = ix.comps.len();
        Ok(Planner {
            ix,
            cfg,
            prior,
            related,
            suspect,
            hit_fail: vec![0; n],
            hit_pass: vec![0; n],
            done: Vec::new(),
            pending: HashMap::new(),
            round: 0,
            next_id: 0,
            node_seconds: 0.0,
            max_planning_ms: 0.0,
            finished: None,
            notes,
        })
    }

    /// Takes observed jobs as evidence before the first round; returns how many failed.
    pub fn observe(&mut self, list: &[Observation]) -> Result<usize, String> {
        if list.len() > MAX_OBSERVATIONS {
            return Err(format!(
                "{} observed jobs, more than {MAX_OBSERVATIONS}",
                list.len()
            ));
        }
        for (i, o) in list.iter().enumerate() {
            let at = o.label.clone().unwrap_or_else(|| format!("job {i}"));
            let mut nodes = Vec::with_capacity(o.nodes.len());
            for n in &o.nodes {
                nodes.push(
                    self.ix
                        .node(n)
                        .ok_or_else(|| format!("[{i}] {at}: {n:?} is not a node of the fabric"))?,
                );
            }
            let paths = self
                .ix
                .path(&nodes, o.rail)
                .map_err(|e| format!("[{i}] {at}: {e}"))?;
            let busbw = match (o.busbw_gbs, &o.error) {
                (_, Some(_)) => None,
                (Some(b), None) if b.is_finite() && b >= 0.0 => Some(b),
                _ => {
                    return Err(format!(
                        "[{i}] {at}: needs busbw_gbs (a bandwidth) or error"
                    ));
                }
            };
            let mut comps: Vec<u32> = paths.iter().flat_map(|p| p.comps.iter().copied()).collect();
            comps.sort_unstable();
            comps.dedup();
            let slowest = paths.iter().map(|p| p.gbps).fold(f64::INFINITY, f64::min);
            let nominal = slowest / 8.0 * paths.len() as f64;
            self.done.push(Done {
                id: at,
                round: 0,
                nodes,
                rail: o.rail,
                comps,
                failed: busbw.is_none(),
                ratio: busbw.map(|b| b / nominal),
                busbw,
                error: o.error.clone(),
            });
        }
        self.judge();
        let failed = self
            .done
            .iter()
            .filter(|t| t.round == 0 && t.failed)
            .count();
        self.notes.push(format!(
            "{} observed jobs taken as evidence, {failed} of them slow or failed",
            list.len()
        ));
        Ok(failed)
    }

    /// The next round's tests; `None` when the planner is done.
    pub fn next_round(&mut self) -> Option<RoundRequest> {
        if self.finished.is_some() {
            return None;
        }
        let start = std::time::Instant::now();
        let explained = score::explain(self);
        let resolved = explained
            .iter()
            .all(|l| l.confidence >= self.cfg.confidence);
        let failures = self.done.iter().any(|t| t.failed);
        let covered = self.round >= self.cfg.min_rounds;
        if self.round >= self.cfg.max_rounds {
            self.finished = Some(format!("stopped after {} rounds", self.round));
        } else if resolved && failures && covered {
            self.finished = Some("every failure is explained".into());
        } else if !failures && self.round >= self.cfg.min_rounds.max(1) * 2 {
            self.finished = Some("no test failed: the fault did not show".into());
        }
        if self.finished.is_some() {
            return None;
        }
        let tests = design::round(self, &explained);
        self.max_planning_ms = self
            .max_planning_ms
            .max(start.elapsed().as_secs_f64() * 1e3);
        if tests.is_empty() {
            self.finished = Some("no test left that could tell the candidates apart".into());
            return None;
        }
        self.round += 1;
        let mut specs = Vec::with_capacity(tests.len());
        for t in tests {
            self.next_id += 1;
            let id = format!("t{}", self.next_id);
            specs.push(super::sim::TestSpec {
                id: id.clone(),
                kind: super::sim::ALL_REDUCE.into(),
                nodes: t
                    .nodes
                    .iter()
                    .map(|&n| self.ix.nodes[n as usize].name.clone())
                    .collect(),
                rail: t.rail,
                bytes: super::sim::TEST_BYTES,
            });
            self.pending.insert(
                id,
                Pending {
                    nodes: t.nodes,
                    rail: t.rail,
                    comps: t.comps,
                    nominal: t.nominal_gbs,
                },
            );
        }
        Some(RoundRequest {
            round: self.round,
            tests: specs,
        })
    }

    /// Takes back a round this planner's kind chose earlier (a planner rebuilt from stored
    /// rounds, as the server's investigations are on every step): the round becomes the
    /// running one, and [`Planner::record`] then takes its results. The round must follow
    /// the last one; each test's nodes and rail must be the fabric's.
    pub fn resume(&mut self, req: &RoundRequest) -> Result<(), String> {
        if req.round != self.round + 1 || !self.pending.is_empty() {
            return Err(format!(
                "round {} cannot follow round {} here",
                req.round, self.round
            ));
        }
        let mut pending = HashMap::with_capacity(req.tests.len());
        let mut next_id = self.next_id;
        for t in &req.tests {
            let nodes = t
                .nodes
                .iter()
                .map(|n| {
                    self.ix
                        .node(n)
                        .ok_or_else(|| format!("{}: {n:?} is not a node of the fabric", t.id))
                })
                .collect::<Result<Vec<u32>, String>>()?;
            let paths = self
                .ix
                .path(&nodes, t.rail)
                .map_err(|e| format!("{}: {e}", t.id))?;
            let mut comps: Vec<u32> = paths.iter().flat_map(|p| p.comps.iter().copied()).collect();
            comps.sort_unstable();
            comps.dedup();
            let slowest = paths.iter().map(|p| p.gbps).fold(f64::INFINITY, f64::min);
            if let Some(n) = t.id.strip_prefix('t').and_then(|n| n.parse::<u64>().ok()) {
                next_id = next_id.max(n);
            }
            let entry = Pending {
                nodes,
                rail: t.rail,
                comps,
                nominal: slowest / 8.0 * paths.len() as f64,
            };
            if pending.insert(t.id.clone(), entry).is_some() {
                return Err(format!("{}: twice in round {}", t.id, req.round));
            }
        }
        self.pending = pending;
        self.next_id = next_id;
        self.round = req.round;
        Ok(())
    }

    /// Makes the next test ids follow `t{last}`: ids of tests that were chosen but never ran
    /// (and so never resumed) are not given again.
    pub fn ids_past(&mut self, last: u64) {
        self.next_id = self.next_id.max(last);
    }

    /// Takes a round's results; every test of the round must be answered once.
    pub fn record(&mut self, res: &RoundResults) -> Result<(), String> {
        if res.round != self.round {
            return Err(format!(
                "results for round {}, but round {} is running",
                res.round, self.round
            ));
        }
        let mut seen = HashSet::new();
        let mut batch = Vec::with_capacity(res.results.len());
        for r in &res.results {
            if !seen.insert(r.id.as_str()) {
                return Err(format!("{}: answered twice", r.id));
            }
            let p = self
                .pending
                .remove(&r.id)
                .ok_or_else(|| format!("{}: no such test in this round", r.id))?;
            let busbw = match (r.busbw_gbs, &r.error) {
                (_, Some(_)) => None,
                (Some(b), None) if b.is_finite() && b >= 0.0 => Some(b),
                (Some(b), None) => {
                    return Err(format!("{}: busbw_gbs {b} is not a bandwidth", r.id));
                }
                (None, None) => return Err(format!("{}: neither busbw_gbs nor error", r.id)),
            };
            let seconds = r
                .seconds
                .filter(|s| s.is_finite() && *s >= 0.0)
                .unwrap_or(DEFAULT_SECONDS);
            self.node_seconds += seconds * p.nodes.len() as f64;
            batch.push(Done {
                id: r.id.clone(),
                round: self.round,
                nodes: p.nodes,
                rail: p.rail,
                comps: p.comps,
                failed: busbw.is_none(),
                ratio: busbw.map(|b| b / p.nominal),
                busbw,
                error: r.error.clone(),
            });
        }
        if let Some(id) = self.pending.keys().next() {
            return Err(format!(
                "{id}: no result ({} tests of the round unanswered)",
                self.pending.len()
            ));
        }
        self.done.extend(batch);
        self.judge();
        Ok(())
    }

    /// Judges every result again against the reference, the 80th percentile of the
    /// ratios seen so far: robust while at least a fifth of the tests are healthy.
    fn judge(&mut self) {
        let mut ratios: Vec<f64> = self.done.iter().filter_map(|t| t.ratio).collect();
        if ratios.is_empty() {
            return;
        }
        ratios.sort_by(f64::total_cmp);
        let reference = ratios[(ratios.len() * 4 / 5).min(ratios.len() - 1)];
        self.hit_fail.iter_mut().for_each(|c| *c = 0);
        self.hit_pass.iter_mut().for_each(|c| *c = 0);
        for t in &mut self.done {
            t.failed = match t.ratio {
                None => true,
                Some(r) => r < SLOW_FRACTION * reference,
            };
            let counts = if t.failed {
                &mut self.hit_fail
            } else {
                &mut self.hit_pass
            };
            for &c in &t.comps {
                counts[c as usize] += 1;
            }
        }
    }

    pub fn answer(&self) -> Answer {
        let explained = score::explain(self);
        let mut blamed = Vec::new();
        let mut candidates = Vec::new();
        let mut notes = self.notes.clone();
        if let Some(why) = &self.finished {
            notes.push(why.clone());
        }
        let mut conclusive = true;
        for level in &explained {
            let comp = &self.ix.comps[level.top as usize];
            let sure = level.confidence >= self.cfg.confidence;
            if sure && comp.members.len() <= 1 {
                blamed.push(self.blame(level.top, level.confidence));
                continue;
            }
            conclusive = false;
            if sure {
                notes.push(format!(
                    "{} spines reach exactly the same leaves; no test can tell them apart",
                    comp.members.join(", ")
                ));
                let share = level.confidence / comp.members.len() as f64;
                for m in &comp.members {
                    let mut b = self.blame(level.top, share);
                    b.id = m.clone();
                    candidates.push(b);
                }
            } else {
                for &(c, p) in level.alternatives.iter().take(5) {
                    candidates.push(self.blame(c, p));
                }
            }
        }
        Answer {
            blamed,
            rounds: self.round,
            tests: self.done.iter().filter(|t| t.round > 0).count() as u32,
            node_seconds: self.node_seconds.round(),
            conclusive,
            candidates,
            notes,
            max_planning_ms: (self.max_planning_ms * 1000.0).round() / 1000.0,
        }
    }

    /// A component with the tests that implicate it.
    fn blame(&self, c: u32, confidence: f64) -> Blame {
        let comp = &self.ix.comps[c as usize];
        let mut evidence = Vec::new();
        let crossing: Vec<&Done> = self
            .done
            .iter()
            .filter(|t| t.comps.binary_search(&c).is_ok())
            .collect();
        for t in crossing.iter().filter(|t| t.failed).take(6) {
            let names: Vec<&str> = t
                .nodes
                .iter()
                .take(4)
                .map(|&n| self.ix.nodes[n as usize].name.as_str())
                .collect();
            let more = if t.nodes.len() > 4 {
                format!(" and {} more", t.nodes.len() - 4)
            } else {
                String::new()
            };
            let rail = t
                .rail
                .map_or("every rail".to_string(), |r| format!("rail {r}"));
            let what = match (&t.error, t.busbw) {
                (Some(e), _) => e.clone(),
                (None, Some(b)) => format!("{b:.1} GB/s, slow"),
                (None, None) => "failed".into(),
            };
            evidence.push(format!(
                "round {} {} ({}{more}, {rail}): {what}",
                t.round,
                t.id,
                names.join(", ")
            ));
        }
        let passed = crossing.iter().filter(|t| !t.failed).count();
        let failed = crossing.len() - passed;
        evidence.push(format!(
            "{failed} failing and {passed} passing tests crossed it"
        ));
        if comp.kind == Kind::Node && self.ix.nodes[c as usize].nics.len() == 1 {
            evidence.push("the node has one NIC: a fault of that NIC reads the same".into());
        }
        Blame {
            component: comp.kind,
            id: comp.id.clone(),
            confidence: (confidence * 1e4).round() / 1e4,
            evidence,
        }
    }
}

/// Runs a planner to its end against `oracle`, one round at a time.
pub fn run(
    planner: &mut Planner,
    oracle: &mut dyn FnMut(&RoundRequest) -> Result<RoundResults, String>,
) -> Result<Answer, String> {
    while let Some(request) = planner.next_round() {
        let results = oracle(&request)?;
        planner.record(&results)?;
    }
    Ok(planner.answer())
}

#[cfg(test)]
#[path = "plan/tests.rs"]
mod tests;
