//! A [`Fabric`] numbered for planning: every component a test can blame gets an index
//! ([`Comp`]), and [`Index::path`] says which of them a test over some nodes on one rail (or
//! all of them) crosses, by the rules of a fat tree: NICs under one leaf talk through that
//! leaf only; between leaves, traffic is spread over every spine both leaves reach (ECMP)
//! and so runs at the pace of the slowest of those paths.
//!
//! Components that no test could tell apart are one component: the uplinks of a leaf to
//! spines that reach exactly the same leaves (`LEAF~*`), and such spines themselves (one
//! component with several `members`).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{Fabric, Tier};

/// What a component is, as the answer names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Node,
    /// A NIC or its cable to the leaf: no test tells the two apart.
    Nic,
    Leaf,
    /// A leaf's link(s) to the spines.
    Uplink,
    Spine,
}

#[derive(Debug, Clone)]
pub struct Comp {
    pub kind: Kind,
    /// `NODE`, `NODE/NIC`, `LEAF`, `A~B` (names sorted) or `LEAF~*`, `SPINE`.
    pub id: String,
    /// The switches a spine component stands for when several are indistinguishable.
    pub members: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct INode {
    pub name: String,
    pub nics: Vec<u32>,
    /// The NIC on each rail, by rail number.
    pub by_rail: Vec<Option<u32>>,
}

#[derive(Debug, Clone)]
pub struct INic {
    pub node: u32,
    pub name: String,
    pub rail: u32,
    pub leaf: u32,
    pub gbps: f64,
}

/// The rate assumed for a NIC no source gave one (only ratios are judged on it).
pub const DEFAULT_GBPS: f64 = 100.0;

#[derive(Debug, Clone)]
pub struct Index {
    pub nodes: Vec<INode>,
    pub nics: Vec<INic>,
    pub switch_names: Vec<String>,
    pub rails: u32,
    pub comps: Vec<Comp>,
    /// Per switch: its component when it is a leaf.
    pub leaf_comp: Vec<Option<u32>>,
    /// Per switch: the NICs cabled to it.
    pub leaf_nics: Vec<Vec<u32>>,
    /// Per leaf switch: its spines, with the uplink component of each.
    pub leaf_spines: Vec<Vec<(u32, u32)>>,
    /// Per switch: its component when it is a spine.
    pub spine_comp: Vec<Option<u32>>,
    /// Nodes left out of planning, and why.
    pub unmapped: Vec<(String, String)>,
    node_by_name: HashMap<String, u32>,
}

/// What a test crosses on one rail.
#[derive(Debug, Clone, PartialEq)]
pub struct RailPath {
    pub rail: u32,
    /// Components, sorted, without repeats.
    pub comps: Vec<u32>,
    /// The slowest NIC's rate.
    pub gbps: f64,
}

impl Index {
    pub fn new(f: &Fabric) -> Index {
        let mut sw_ix: HashMap<&str, u32> = HashMap::new();
        let mut switch_names = Vec::new();
        for s in &f.switches {
            sw_ix.insert(&s.name, switch_names.len() as u32);
            switch_names.push(s.name.clone());
        }
        let tier = |i: u32| f.switches[i as usize].tier;
        let mut ix = Index {
            nodes: Vec::new(),
            nics: Vec::new(),
            switch_names,
            rails: 0,
            comps: Vec::new(),
            leaf_comp: vec![None; f.switches.len()],
            leaf_nics: vec![Vec::new(); f.switches.len()],
            leaf_spines: vec![Vec::new(); f.switches.len()],
            spine_comp: vec![None; f.switches.len()],
            unmapped: Vec::new(),
            node_by_name: HashMap::new(),
        };
        for n in &f.nodes {
            let mapped: Vec<_> = n
                .nics
                .iter()
                .filter_map(|nic| {
                    let leaf = *sw_ix.get(nic.leaf.as_deref()?)?;
                    Some((nic, nic.rail?, leaf))
                })
                .filter(|(_, _, leaf)| tier(*leaf) == Tier::Leaf)
                .collect();
            if mapped.is_empty() {
                ix.unmapped
                    .push((n.name.clone(), "no NIC with a rail and a leaf".into()));
                continue;
            }
            if mapped.len() < n.nics.len() {
                ix.unmapped.push((
                    n.name.clone(),
                    format!(
                        "{} of {} NICs lack a rail or a leaf",
                        n.nics.len() - mapped.len(),
                        n.nics.len()
                    ),
                ));
            }
            let node = ix.nodes.len() as u32;
            let mut inode = INode {
                name: n.name.clone(),
                nics: Vec::new(),
                by_rail: Vec::new(),
            };
            for (nic, rail, leaf) in mapped {
                let k = ix.nics.len() as u32;
                ix.nics.push(INic {
                    node,
                    name: nic.name.clone(),
                    rail,
                    leaf,
                    gbps: nic.gbps.unwrap_or(DEFAULT_GBPS),
                });
                ix.rails = ix.rails.max(rail + 1);
                if inode.by_rail.len() <= rail as usize {
                    inode.by_rail.resize(rail as usize + 1, None);
                }
                inode.by_rail[rail as usize] = Some(k);
                inode.nics.push(k);
                ix.leaf_nics[leaf as usize].push(k);
            }
            ix.node_by_name.insert(n.name.clone(), node);
            ix.nodes.push(inode);
        }
        // Components: nodes, NICs, leaves, then uplinks and spines.
        for n in &ix.nodes {
            ix.comps.push(Comp {
                kind: Kind::Node,
                id: n.name.clone(),
                members: Vec::new(),
            });
        }
        for nic in &ix.nics {
            let id = format!("{}/{}", ix.nodes[nic.node as usize].name, nic.name);
            ix.comps.push(Comp {
                kind: Kind::Nic,
                id,
                members: Vec::new(),
            });
        }
        for (i, s) in f.switches.iter().enumerate() {
            if s.tier == Tier::Leaf {
                ix.leaf_comp[i] = Some(ix.comps.len() as u32);
                ix.comps.push(Comp {
                    kind: Kind::Leaf,
                    id: s.name.clone(),
                    members: Vec::new(),
                });
            }
        }
        // Leaf–spine adjacency from the links.
        let mut spines_of: Vec<Vec<u32>> = vec![Vec::new(); f.switches.len()];
        let mut leaves_of: Vec<Vec<u32>> = vec![Vec::new(); f.switches.len()];
        for l in &f.links {
            let (Some(&a), Some(&b)) = (sw_ix.get(l.a.as_str()), sw_ix.get(l.b.as_str())) else {
                continue;
            };
            let (leaf, spine) = match (tier(a), tier(b)) {
                (Tier::Leaf, Tier::Spine) => (a, b),
                (Tier::Spine, Tier::Leaf) => (b, a),
                _ => continue,
            };
            if !spines_of[leaf as usize].contains(&spine) {
                spines_of[leaf as usize].push(spine);
                leaves_of[spine as usize].push(leaf);
            }
        }
        // Spines that reach the same leaves are one component.
        let mut classes: BTreeMap<Vec<u32>, Vec<u32>> = BTreeMap::new();
        for (s, leaves) in leaves_of.iter_mut().enumerate() {
            if !leaves.is_empty() {
                leaves.sort_unstable();
                classes.entry(leaves.clone()).or_default().push(s as u32);
            }
        }
        let mut class_of: HashMap<u32, (u32, usize)> = HashMap::new();
        for members in classes.values() {
            let c = ix.comps.len() as u32;
            for &s in members {
                ix.spine_comp[s as usize] = Some(c);
                class_of.insert(s, (c, members.len()));
            }
            let names: Vec<String> = members
                .iter()
                .map(|&s| ix.switch_names[s as usize].clone())
                .collect();
            ix.comps.push(Comp {
                kind: Kind::Spine,
                id: names[0].clone(),
                members: names,
            });
        }
        // A leaf's uplinks toward one spine component are one component.
        for (leaf, spines) in spines_of.iter().enumerate() {
            let mut by_class: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for &s in spines {
                by_class.entry(class_of[&s].0).or_default().push(s);
            }
            for ss in by_class.values() {
                let lname = &ix.switch_names[leaf];
                let id = if ss.len() == 1 {
                    let sname = &ix.switch_names[ss[0] as usize];
                    let (a, b) = if lname <= sname {
                        (lname, sname)
                    } else {
                        (sname, lname)
                    };
                    format!("{a}~{b}")
                } else {
                    format!("{lname}~*")
                };
                let c = ix.comps.len() as u32;
                ix.comps.push(Comp {
                    kind: Kind::Uplink,
                    id,
                    members: Vec::new(),
                });
                for &s in ss {
                    ix.leaf_spines[leaf].push((s, c));
                }
            }
        }
        ix
    }

    pub fn node(&self, name: &str) -> Option<u32> {
        self.node_by_name.get(name).copied()
    }

    pub fn node_comp(&self, node: u32) -> u32 {
        node
    }

    pub fn nic_comp(&self, nic: u32) -> u32 {
        self.nodes.len() as u32 + nic
    }

    /// The NIC a NIC component stands for.
    pub fn comp_nic(&self, comp: u32) -> Option<u32> {
        let n = self.nodes.len() as u32;
        (comp >= n && comp < n + self.nics.len() as u32).then(|| comp - n)
    }

    /// What a test over `nodes` on `rail` (every rail of theirs when `None`) crosses, rail
    /// by rail.
    pub fn path(&self, nodes: &[u32], rail: Option<u32>) -> Result<Vec<RailPath>, String> {
        if nodes.len() < 2 {
            return Err("a test needs two nodes at least".into());
        }
        let rails: Vec<u32> = match rail {
            Some(r) => vec![r],
            None => (0..self.rails).collect(),
        };
        let mut out = Vec::with_capacity(rails.len());
        for r in rails {
            let mut comps = Vec::with_capacity(nodes.len() * 2 + 8);
            let mut leaves = Vec::new();
            let mut gbps = f64::INFINITY;
            for &n in nodes {
                let node = &self.nodes[n as usize];
                let Some(Some(k)) = node.by_rail.get(r as usize) else {
                    if rail.is_none() {
                        continue;
                    }
                    return Err(format!("{} has no NIC on rail {r}", node.name));
                };
                let nic = &self.nics[*k as usize];
                comps.push(self.node_comp(n));
                comps.push(self.nic_comp(*k));
                gbps = gbps.min(nic.gbps);
                if !leaves.contains(&nic.leaf) {
                    leaves.push(nic.leaf);
                }
            }
            if comps.len() < 4 {
                continue;
            }
            for &l in &leaves {
                comps.extend(self.leaf_comp[l as usize]);
            }
            if leaves.len() > 1 {
                let mut count: HashMap<u32, u32> = HashMap::new();
                for &l in &leaves {
                    for &(s, _) in &self.leaf_spines[l as usize] {
                        *count.entry(s).or_default() += 1;
                    }
                }
                for &l in &leaves {
                    let mut any = false;
                    for &(s, up) in &self.leaf_spines[l as usize] {
                        if count[&s] > 1 {
                            any = true;
                            comps.push(up);
                            comps.extend(self.spine_comp[s as usize]);
                        }
                    }
                    if !any {
                        return Err(format!(
                            "leaf {} shares no spine with the test's other leaves",
                            self.switch_names[l as usize]
                        ));
                    }
                }
            }
            comps.sort_unstable();
            comps.dedup();
            out.push(RailPath {
                rail: r,
                comps,
                gbps,
            });
        }
        if out.is_empty() {
            return Err("the nodes share no rail".into());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::generate::{FatTree, fat_tree};

    #[test]
    fn paths_follow_the_fat_tree() {
        let f = fat_tree(&FatTree {
            nodes: 8,
            rails: 2,
            nodes_per_leaf: 4,
            spines_per_rail: 2,
        });
        let ix = Index::new(&f);
        assert_eq!(ix.rails, 2);
        let id = |c: &u32| ix.comps[*c as usize].id.clone();
        let n = |s: &str| ix.node(s).unwrap();
        // Under one leaf: two nodes, two NICs, the leaf.
        let p = ix.path(&[n("n0001"), n("n0002")], Some(1)).unwrap();
        let ids: Vec<_> = p[0].comps.iter().map(id).collect();
        assert_eq!(
            ids,
            [
                "n0001",
                "n0002",
                "n0001/mlx5_1",
                "n0002/mlx5_1",
                "leaf-su0-r1"
            ]
        );
        // Across leaves: both leaves' uplinks, and the rail's two spines as one component.
        let p = ix.path(&[n("n0001"), n("n0005")], Some(0)).unwrap();
        let ids: Vec<_> = p[0].comps.iter().map(id).collect();
        assert!(ids.contains(&"leaf-su0-r0~*".to_string()), "{ids:?}");
        assert!(ids.contains(&"leaf-su1-r0~*".to_string()), "{ids:?}");
        let spine = p[0]
            .comps
            .iter()
            .find(|c| ix.comps[**c as usize].kind == Kind::Spine)
            .unwrap();
        assert_eq!(
            ix.comps[*spine as usize].members,
            ["spine-r0-0", "spine-r0-1"]
        );
        // Every rail at once.
        assert_eq!(ix.path(&[n("n0001"), n("n0005")], None).unwrap().len(), 2);
        assert!(ix.path(&[n("n0001")], None).is_err());
    }

    #[test]
    fn one_spine_a_rail_names_each_uplink() {
        let f = fat_tree(&FatTree {
            nodes: 8,
            rails: 1,
            nodes_per_leaf: 4,
            spines_per_rail: 1,
        });
        let ix = Index::new(&f);
        assert!(ix.comps.iter().any(|c| c.id == "leaf-su1-r0~spine-r0-0"));
    }
}
