//! A fabric model that answers the planner's tests as the simulator's oracle: a test's bus
//! bandwidth is what its slowest component allows (a rail-aligned test runs at its rail's
//! pace, a `rail: null` test at its slowest rail's pace times the rails), with noise, and
//! the faults given to it slow what they are part of, or hang it, on every test or on a
//! fraction of them (an intermittent fault).

use std::collections::HashMap;

use super::index::{Index, Kind};
use super::sim::{RoundRequest, RoundResults, TestResult};

/// What a healthy path delivers of its slowest NIC's rate, as bus bandwidth.
pub const EFFICIENCY: f64 = 0.92;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Effect {
    /// The component runs at this fraction of its rate.
    Slow(f64),
    Hang,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: Kind,
    /// As the answers name components; an uplink as `LEAF~SPINE` (either order).
    pub id: String,
    pub effect: Effect,
    /// The fraction of tests crossing it that it spoils (1 for a hard fault).
    pub probability: f64,
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// `KIND:ID[:slow=F|:hang][:p=P]`, e.g. `nic:n0001/mlx5_3`, `uplink:leaf-su0-r0~spine-r0-0:p=0.33`.
    fn from_str(s: &str) -> Result<Fault, String> {
        let mut parts = s.split(':');
        let kind = match parts.next() {
            Some("node") => Kind::Node,
            Some("nic") | Some("link") => Kind::Nic,
            Some("leaf") => Kind::Leaf,
            Some("uplink") => Kind::Uplink,
            Some("spine") => Kind::Spine,
            _ => {
                return Err(format!(
                    "{s:?}: a fault is node|nic|leaf|uplink|spine:ID[:slow=F|:hang][:p=P]"
                ));
            }
        };
        let id = parts
            .next()
            .filter(|i| !i.is_empty())
            .ok_or_else(|| format!("{s:?}: no id"))?;
        let mut fault = Fault {
            kind,
            id: id.to_string(),
            effect: Effect::Slow(0.25),
            probability: 1.0,
        };
        for p in parts {
            if p == "hang" {
                fault.effect = Effect::Hang;
            } else if let Some(v) = p.strip_prefix("slow=") {
                let f: f64 = v
                    .parse()
                    .map_err(|_| format!("{s:?}: slow={v} is not a number"))?;
                if !(0.0..1.0).contains(&f) {
                    return Err(format!("{s:?}: slow= is a fraction below 1"));
                }
                fault.effect = Effect::Slow(f);
            } else if let Some(v) = p.strip_prefix("p=") {
                let f: f64 = v
                    .parse()
                    .map_err(|_| format!("{s:?}: p={v} is not a number"))?;
                if f.is_nan() || f <= 0.0 || f > 1.0 {
                    return Err(format!("{s:?}: p= is a probability in (0, 1]"));
                }
                fault.probability = f;
            } else {
                return Err(format!("{s:?}: {p:?} is not slow=F, hang or p=P"));
            }
        }
        Ok(fault)
    }
}

/// SplitMix64: small, seeded, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

pub struct Model<'a> {
    ix: &'a Index,
    /// Component → its faults' effects and probabilities.
    faults: HashMap<u32, Vec<(Effect, f64)>>,
    /// Relative standard deviation of a healthy result.
    pub noise: f64,
    rng: Rng,
}

impl<'a> Model<'a> {
    pub fn new(ix: &'a Index, faults: &[Fault], seed: u64) -> Result<Model<'a>, String> {
        let mut by_comp: HashMap<u32, Vec<(Effect, f64)>> = HashMap::new();
        for f in faults {
            let c = resolve(ix, f)?;
            by_comp
                .entry(c)
                .or_default()
                .push((f.effect, f.probability));
        }
        Ok(Model {
            ix,
            faults: by_comp,
            noise: 0.03,
            rng: Rng::new(seed),
        })
    }

    pub fn answer(&mut self, req: &RoundRequest) -> RoundResults {
        let results = req.tests.iter().map(|t| self.one(t)).collect();
        RoundResults {
            round: req.round,
            results,
        }
    }

    fn one(&mut self, t: &super::sim::TestSpec) -> TestResult {
        let fail = |id: &str, e: &str| TestResult {
            id: id.to_string(),
            busbw_gbs: None,
            error: Some(e.to_string()),
            seconds: Some(60.0),
        };
        let mut nodes = Vec::with_capacity(t.nodes.len());
        for n in &t.nodes {
            match self.ix.node(n) {
                Some(i) => nodes.push(i),
                None => return fail(&t.id, "unknown node"),
            }
        }
        let paths = match self.ix.path(&nodes, t.rail) {
            Ok(p) => p,
            Err(_) => return fail(&t.id, "no path"),
        };
        let mut slowest = f64::INFINITY;
        let mut hung = false;
        for p in &paths {
            let mut bw = p.gbps / 8.0 * EFFICIENCY;
            for c in &p.comps {
                for &(effect, prob) in self.faults.get(c).map(Vec::as_slice).unwrap_or(&[]) {
                    if prob >= 1.0 || self.rng.unit() < prob {
                        match effect {
                            Effect::Hang => hung = true,
                            Effect::Slow(f) => bw *= f,
                        }
                    }
                }
            }
            slowest = slowest.min(bw);
        }
        if hung {
            return fail(&t.id, "hung");
        }
        let busbw =
            (slowest * paths.len() as f64 * (1.0 + self.noise * self.rng.normal())).max(0.01);
        let seconds = 10.0 + 2.0 * t.bytes as f64 / (busbw * 1e9);
        TestResult {
            id: t.id.clone(),
            busbw_gbs: Some((busbw * 100.0).round() / 100.0),
            error: None,
            seconds: Some((seconds * 100.0).round() / 100.0),
        }
    }
}

/// The component a fault lives in: an uplink cable is part of its leaf's uplink component.
pub fn resolve(ix: &Index, f: &Fault) -> Result<u32, String> {
    if f.kind == Kind::Uplink {
        let (a, b) =
            f.id.split_once('~')
                .ok_or_else(|| format!("{}: an uplink is LEAF~SPINE", f.id))?;
        let sw = |n: &str| ix.switch_names.iter().position(|s| s == n);
        let (Some(a), Some(b)) = (sw(a), sw(b)) else {
            return Err(format!("{}: no such switches", f.id));
        };
        for (leaf, spine) in [(a, b), (b, a)] {
            if let Some(&(_, c)) = ix.leaf_spines[leaf]
                .iter()
                .find(|(s, _)| *s as usize == spine)
            {
                return Ok(c);
            }
        }
        return Err(format!("{}: no such uplink", f.id));
    }
    if f.kind == Kind::Spine
        && let Some(s) = ix.switch_names.iter().position(|n| n == &f.id)
        && let Some(c) = ix.spine_comp[s]
    {
        return Ok(c);
    }
    ix.comps
        .iter()
        .position(|c| c.kind == f.kind && c.id == f.id)
        .map(|c| c as u32)
        .ok_or_else(|| format!("{:?} {}: no such component in the fabric", f.kind, f.id))
}

/// Whether a blamed component is the fault: the same component, an uplink named by its
/// leaf (`LEAF~*`) for a cable of that leaf, or a spine component one of whose members it is.
pub fn matches(ix: &Index, blamed_kind: Kind, blamed_id: &str, fault: &Fault) -> bool {
    if blamed_kind != fault.kind {
        return false;
    }
    match resolve(ix, fault) {
        Ok(c) => {
            let comp = &ix.comps[c as usize];
            comp.id == blamed_id
                || (comp.kind == Kind::Spine && comp.members.iter().any(|m| m == blamed_id))
        }
        Err(_) => false,
    }
}

/// How many of an answer's blamed components are faults (each fault counted once), how
/// many it blamed, and how many faults there were: precision is the first over the second,
/// recall the first over the third.
pub fn tally(ix: &Index, blamed: &[super::sim::Blame], faults: &[Fault]) -> (usize, usize, usize) {
    let mut found = vec![false; faults.len()];
    let mut right = 0;
    for b in blamed {
        if let Some(i) =
            (0..faults.len()).find(|&i| !found[i] && matches(ix, b.component, &b.id, &faults[i]))
        {
            found[i] = true;
            right += 1;
        }
    }
    (right, blamed.len(), faults.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::generate::{FatTree, fat_tree};
    use crate::fabric::sim::TestSpec;

    #[test]
    fn faults_parse_and_slow_what_they_are_part_of() {
        let f = fat_tree(&FatTree {
            nodes: 8,
            rails: 2,
            nodes_per_leaf: 4,
            spines_per_rail: 1,
        });
        let ix = Index::new(&f);
        let fault: Fault = "uplink:spine-r0-0~leaf-su1-r0:slow=0.5".parse().unwrap();
        assert_eq!(fault.effect, Effect::Slow(0.5));
        assert!("nic:x:p=0".parse::<Fault>().is_err());
        assert!("disk:x".parse::<Fault>().is_err());
        let mut m = Model::new(&ix, &[fault], 1).unwrap();
        m.noise = 0.0;
        let test = |nodes: &[&str], rail| TestSpec {
            id: "t".into(),
            kind: "all_reduce".into(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            rail,
            bytes: 1 << 30,
        };
        let req = RoundRequest {
            round: 1,
            tests: vec![
                test(&["n0001", "n0002"], Some(0)),
                test(&["n0001", "n0005"], Some(0)),
                test(&["n0001", "n0005"], Some(1)),
                test(&["n0001", "n0005"], None),
            ],
        };
        let bw: Vec<_> = m
            .answer(&req)
            .results
            .iter()
            .map(|r| r.busbw_gbs.unwrap())
            .collect();
        assert_eq!(bw, [46.0, 23.0, 46.0, 46.0]);
        let bad: Fault = "spine:nowhere".parse().unwrap();
        assert!(Model::new(&ix, &[bad], 1).is_err());
    }
}
