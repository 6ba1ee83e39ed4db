//! Choosing a round's tests. First for the candidates of every fault not yet blamed with
//! confidence, then, with what is left of the round, for components tested fewer than
//! `min_rounds` times (so that every part of the suspects' fabric is seen, and an
//! intermittent fault gets its chances to show):
//!
//! - under a leaf: each candidate NIC (or node, on every rail) with a known-good partner
//!   under the same leaf — one failing test then names it — or, while there are too few
//!   of those, candidates in pairs, shuffled each round; a candidate leaf also with two
//!   known-good NICs alone;
//! - between leaves: a candidate leaf's uplinks with a known-good leaf of the same rail
//!   (each leaf in one such test a round: its uplinks are shared), a candidate spine
//!   between two leaves that reach it.
//!
//! A round's tests share no NIC and no leaf's uplinks, and take at most `max_nodes` nodes.

use std::collections::{HashMap, HashSet};

use super::Planner;
use super::score::{Level, good};
use crate::fabric::index::Kind;
use crate::fabric::model::Rng;

pub(crate) struct Proposed {
    pub nodes: Vec<u32>,
    pub rail: Option<u32>,
    pub comps: Vec<u32>,
    /// The path's rate in GB/s, which a result's bandwidth is judged against.
    pub nominal_gbs: f64,
}

struct Round<'p, 'a> {
    p: &'p Planner<'a>,
    used_nic: HashSet<u32>,
    used_uplinks: HashSet<u32>,
    nodes: HashSet<u32>,
    tests: Vec<Proposed>,
    rng: Rng,
    /// Per leaf switch: the rail of its NICs.
    leaf_rail: HashMap<u32, u32>,
    /// Uplink component → its leaf; spine switch → the leaves cabled to it.
    uplink_leaf: HashMap<u32, u32>,
    spine_leaves: HashMap<u32, Vec<u32>>,
}

pub(crate) fn round(p: &Planner, levels: &[Level]) -> Vec<Proposed> {
    let ix = p.ix;
    let mut r = Round {
        p,
        used_nic: HashSet::new(),
        used_uplinks: HashSet::new(),
        nodes: HashSet::new(),
        tests: Vec::new(),
        rng: Rng::new(p.cfg.seed ^ (p.round as u64).wrapping_mul(0x9e37_79b9)),
        leaf_rail: HashMap::new(),
        uplink_leaf: HashMap::new(),
        spine_leaves: HashMap::new(),
    };
    for (leaf, nics) in ix.leaf_nics.iter().enumerate() {
        if let Some(&k) = nics.first() {
            r.leaf_rail.insert(leaf as u32, ix.nics[k as usize].rail);
        }
        for &(s, up) in &ix.leaf_spines[leaf] {
            r.uplink_leaf.insert(up, leaf as u32);
            r.spine_leaves.entry(s).or_default().push(leaf as u32);
        }
    }
    let mut focus: HashMap<u32, f64> = HashMap::new();
    for level in levels.iter().filter(|l| l.confidence < p.cfg.confidence) {
        for &(c, w) in &level.window {
            *focus.entry(c).or_default() += w.max(1e-9);
        }
    }
    r.plan(&focus);
    let coverage: HashMap<u32, f64> = (0..ix.comps.len() as u32)
        .filter(|&c| {
            p.related[c as usize]
                && p.prior[c as usize].is_finite()
                && p.hit_fail[c as usize] + p.hit_pass[c as usize] < p.cfg.min_rounds
        })
        .map(|c| (c, 1.0))
        .collect();
    r.plan(&coverage);
    r.tests
}

impl Round<'_, '_> {
    fn plan(&mut self, focus: &HashMap<u32, f64>) {
        let ix = self.p.ix;
        // Members under each leaf, candidate leaves, uplinks and spines.
        let mut members: HashMap<u32, Vec<(u32, f64)>> = HashMap::new();
        let mut leaves: HashMap<u32, f64> = HashMap::new();
        let mut cross: HashMap<u32, f64> = HashMap::new();
        let mut spines: Vec<(u32, f64)> = Vec::new();
        for (&c, &w) in focus {
            let comp = &ix.comps[c as usize];
            match comp.kind {
                Kind::Node => {
                    for &k in &ix.nodes[c as usize].nics {
                        members
                            .entry(ix.nics[k as usize].leaf)
                            .or_default()
                            .push((c, w));
                    }
                }
                Kind::Nic => {
                    let k = ix.comp_nic(c).expect("a NIC component");
                    let nic = &ix.nics[k as usize];
                    members.entry(nic.leaf).or_default().push((nic.node, w));
                }
                Kind::Leaf => {
                    let leaf = ix
                        .leaf_comp
                        .iter()
                        .position(|&x| x == Some(c))
                        .expect("a leaf") as u32;
                    *leaves.entry(leaf).or_default() += w;
                }
                Kind::Uplink => {
                    let leaf = self.uplink_leaf[&c];
                    *cross.entry(leaf).or_default() += w;
                }
                Kind::Spine => spines.push((c, w)),
            }
        }
        // Between leaves first: they take two NICs a test.
        let mut cross: Vec<(u32, f64)> = cross.into_iter().collect();
        cross.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let candidates: HashSet<u32> = cross.iter().map(|c| c.0).collect();
        for &(leaf, _) in &cross {
            self.cross_test(leaf, None, &candidates);
        }
        spines.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for (c, _) in spines {
            if !self.tests.iter().any(|t| t.comps.binary_search(&c).is_ok()) {
                let members = &ix.comps[c as usize].members;
                let s = ix
                    .switch_names
                    .iter()
                    .position(|n| n == &members[0])
                    .expect("a spine") as u32;
                if let Some(ls) = self.spine_leaves.get(&s).cloned() {
                    let start = self.rng.below(ls.len());
                    for i in 0..ls.len() {
                        if self.cross_test(ls[(start + i) % ls.len()], Some(s), &candidates) {
                            break;
                        }
                    }
                }
            }
        }
        // Under each leaf, most suspicious first.
        let mut order: Vec<(u32, f64)> = members
            .iter()
            .map(|(l, m)| (*l, m.iter().map(|x| x.1).sum::<f64>()))
            .chain(leaves.iter().map(|(l, w)| (*l, *w)))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut seen = HashSet::new();
        for (leaf, _) in order {
            if seen.insert(leaf) {
                let mut m = members.remove(&leaf).unwrap_or_default();
                m.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut once = HashSet::new();
                m.retain(|x| once.insert(x.0));
                self.under_leaf(leaf, &m, leaves.contains_key(&leaf));
            }
        }
    }

    fn allowed(&self, node: u32) -> bool {
        self.p.suspect[node as usize] || self.p.cfg.use_others
    }

    fn room(&self, new: &[u32]) -> bool {
        let max = self.p.cfg.max_nodes;
        max == 0 || self.nodes.len() + new.iter().filter(|n| !self.nodes.contains(n)).count() <= max
    }

    /// The NIC of `node` under `leaf`, when free this round.
    fn free_nic(&self, node: u32, leaf: u32) -> Option<u32> {
        let rail = *self.leaf_rail.get(&leaf)?;
        let k = (*self.p.ix.nodes[node as usize].by_rail.get(rail as usize)?)?;
        (self.p.ix.nics[k as usize].leaf == leaf && !self.used_nic.contains(&k)).then_some(k)
    }

    fn node_good(&self, node: u32, nic: u32) -> bool {
        good(self.p, self.p.ix.node_comp(node)) && good(self.p, self.p.ix.nic_comp(nic))
    }

    /// Free nodes under `leaf` that may serve as known-good partners, tested ones first.
    fn helpers(&self, leaf: u32, not: &HashSet<u32>) -> Vec<u32> {
        let ix = self.p.ix;
        let mut h: Vec<(bool, u32)> = ix.leaf_nics[leaf as usize]
            .iter()
            .map(|&k| (ix.nics[k as usize].node, k))
            .filter(|&(n, k)| {
                !not.contains(&n)
                    && self.allowed(n)
                    && !self.used_nic.contains(&k)
                    && self.node_good(n, k)
            })
            .map(|(n, k)| (self.p.hit_pass[ix.nic_comp(k) as usize] == 0, n))
            .collect();
        h.sort_unstable();
        h.into_iter().map(|x| x.1).collect()
    }

    fn add(&mut self, nodes: Vec<u32>, rail: u32) -> bool {
        if !self.room(&nodes) {
            return false;
        }
        let Ok(paths) = self.p.ix.path(&nodes, Some(rail)) else {
            return false;
        };
        let path = &paths[0];
        for &c in &path.comps {
            if let Some(k) = self.p.ix.comp_nic(c) {
                self.used_nic.insert(k);
            }
            if self.p.ix.comps[c as usize].kind == Kind::Uplink {
                self.used_uplinks.insert(c);
            }
        }
        self.nodes.extend(nodes.iter().copied());
        self.tests.push(Proposed {
            nodes,
            rail: Some(rail),
            comps: path.comps.clone(),
            nominal_gbs: path.gbps / 8.0,
        });
        true
    }

    fn uplinks_free(&self, leaf: u32) -> bool {
        self.p.ix.leaf_spines[leaf as usize]
            .iter()
            .all(|(_, up)| !self.used_uplinks.contains(up))
    }

    /// One node under `leaf` for a test between leaves: a known-good one when there is.
    fn cross_node(&self, leaf: u32) -> Option<u32> {
        let ix = self.p.ix;
        let free: Vec<(u32, u32)> = ix.leaf_nics[leaf as usize]
            .iter()
            .map(|&k| (ix.nics[k as usize].node, k))
            .filter(|&(n, k)| self.allowed(n) && !self.used_nic.contains(&k))
            .collect();
        free.iter()
            .find(|&&(n, k)| self.node_good(n, k))
            .or(free.first())
            .map(|x| x.0)
    }

    /// `leaf`'s uplinks against a partner leaf of its rail (through `via` when given),
    /// a known-good one when there is.
    fn cross_test(&mut self, leaf: u32, via: Option<u32>, candidates: &HashSet<u32>) -> bool {
        let ix = self.p.ix;
        if !self.uplinks_free(leaf) {
            return false;
        }
        let mut partners: Vec<u32> = Vec::new();
        for &(s, _) in &ix.leaf_spines[leaf as usize] {
            if via.is_some_and(|v| v != s) {
                continue;
            }
            for &m in self.spine_leaves.get(&s).map(Vec::as_slice).unwrap_or(&[]) {
                if m != leaf && !partners.contains(&m) && self.uplinks_free(m) {
                    partners.push(m);
                }
            }
        }
        if partners.is_empty() {
            return false;
        }
        let up_good = |m: u32| {
            ix.leaf_spines[m as usize]
                .iter()
                .all(|(_, up)| good(self.p, *up))
        };
        let start = self.rng.below(partners.len());
        partners.rotate_left(start);
        partners.sort_by_key(|&m| (candidates.contains(&m), !up_good(m)));
        for m in partners {
            if let (Some(a), Some(b)) = (self.cross_node(leaf), self.cross_node(m))
                && let Some(&rail) = self.leaf_rail.get(&leaf)
                && self.add(vec![a, b], rail)
            {
                return true;
            }
        }
        false
    }

    fn under_leaf(&mut self, leaf: u32, members: &[(u32, f64)], leaf_candidate: bool) {
        let Some(&rail) = self.leaf_rail.get(&leaf) else {
            return;
        };
        let mut m: Vec<u32> = members
            .iter()
            .map(|x| x.0)
            .filter(|&n| self.allowed(n) && self.free_nic(n, leaf).is_some())
            .collect();
        let not: HashSet<u32> = m.iter().copied().collect();
        let mut helpers = self.helpers(leaf, &not).into_iter();
        let mut rest = Vec::new();
        for n in m.drain(..) {
            match helpers.next() {
                Some(h) => {
                    self.add(vec![n, h], rail);
                }
                None => rest.push(n),
            }
        }
        // Too few known-good partners: candidates in pairs, new pairs each round.
        for i in (1..rest.len()).rev() {
            let j = self.rng.below(i + 1);
            rest.swap(i, j);
        }
        let mut chunks: Vec<Vec<u32>> = rest.chunks(2).map(<[u32]>::to_vec).collect();
        if chunks.last().is_some_and(|c| c.len() == 1) {
            let odd = chunks.pop().expect("a last chunk");
            match chunks.last_mut() {
                Some(c) => c.extend(odd),
                None => {
                    // Alone under its leaf: any free node of the leaf as its partner.
                    let other = self.p.ix.leaf_nics[leaf as usize]
                        .iter()
                        .map(|&k| self.p.ix.nics[k as usize].node)
                        .find(|&n| {
                            n != odd[0] && self.allowed(n) && self.free_nic(n, leaf).is_some()
                        });
                    if let Some(o) = other {
                        chunks.push(vec![odd[0], o]);
                    }
                }
            }
        }
        for c in chunks {
            self.add(c, rail);
        }
        if leaf_candidate {
            let h: Vec<u32> = helpers.take(2).collect();
            if h.len() == 2 {
                self.add(h, rail);
            }
        }
    }
}
