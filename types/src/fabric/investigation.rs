//! Fabric investigations on the server (docs/fabric.md): the request that starts one, what
//! it answers while it runs and when it is done, and the blamed components named in the
//! fabric's own terms ([`place`]) with the nodes that sit behind them ([`behind`]).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::index::Kind;
use super::plan::Observation;
use super::sim::{Answer, Blame};
use super::{Fabric, Tier};
use crate::investigations::InvestigationState;

/// Default of [`FabricInvestigationCreate::timeout_s`]: one test's wall-clock limit.
pub const DEFAULT_TIMEOUT_S: u32 = 300;
/// The most suspects one investigation takes.
pub const MAX_SUSPECTS: usize = 20_000;
/// Most rounds one investigation may be given.
pub const MAX_ROUNDS: u32 = 50;

/// Request to find the broken part of the fabric behind some suspect nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FabricInvestigationCreate {
    /// Suspect nodes: hostnames or Slurm hostlists (`gpu-[0001-0512]`).
    pub suspects: Vec<String>,
    /// The most nodes one round may take (0 or absent: no limit).
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Rounds at most (default 20, at most 50).
    #[serde(default)]
    pub max_rounds: Option<u32>,
    /// Take nodes with a Heddle job queued or running, or a user's job observed running,
    /// too; by default they are left out.
    #[serde(default)]
    pub include_busy: bool,
    /// Only suspects serve as test partners; by default any idle node of the fabric may.
    #[serde(default)]
    pub suspects_only: bool,
    /// Jobs seen before the investigation, taken as evidence before the first round.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub evidence: Vec<Observation>,
    /// One test's wall-clock limit, in seconds (default 300).
    #[serde(default)]
    pub timeout_s: Option<u32>,
    #[serde(default)]
    pub label: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FabricTestState {
    /// Its run is queued or running.
    Running,
    /// Its run succeeded with a figure.
    Done,
    /// Its run failed, hung, was cancelled or gave no figure: evidence against its path.
    Failed,
    /// It could not be started (its nodes' environments came to disagree): no evidence.
    Skipped,
}

impl FabricTestState {
    pub fn as_str(self) -> &'static str {
        match self {
            FabricTestState::Running => "running",
            FabricTestState::Done => "done",
            FabricTestState::Failed => "failed",
            FabricTestState::Skipped => "skipped",
        }
    }
}

impl std::str::FromStr for FabricTestState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            FabricTestState::Running,
            FabricTestState::Done,
            FabricTestState::Failed,
            FabricTestState::Skipped,
        ]
        .into_iter()
        .find(|t| t.as_str() == s)
        .ok_or_else(|| format!("unknown fabric test state {s:?}"))
    }
}

/// One test of a fabric investigation: an NCCL all_reduce over its nodes, on one rail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FabricTest {
    pub round: u32,
    /// `t1`, `t2`, ... in the order the planner chose them.
    pub id: String,
    pub nodes: Vec<String>,
    /// `None`: every rail of the nodes.
    pub rail: Option<u32>,
    pub bytes: u64,
    pub run_id: Option<Uuid>,
    pub state: FabricTestState,
    pub busbw_gbs: Option<f64>,
    pub error: Option<String>,
    /// How long its run took, from the first start to the last finish.
    pub seconds: Option<f64>,
}

/// A blamed component (or a candidate), in the fabric's terms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FabricPart {
    pub component: Kind,
    pub id: String,
    pub confidence: f64,
    /// Where it is: "leaf-su2-r3 port 17 ↔ node gpu-0412 NIC mlx5_3".
    pub place: String,
    /// The nodes whose traffic crosses it, as a hostlist.
    pub nodes: String,
    pub node_count: u32,
    pub evidence: Vec<String>,
}

impl FabricPart {
    /// Whether `node`'s traffic crosses this part: its `nodes` hostlist holds it (read with
    /// the fabric's bound, not the command line's: a spine's may name every node).
    pub fn covers(&self, node: &str) -> bool {
        crate::hostlist::expand_at_most(&self.nodes, super::MAX_NODES)
            .is_ok_and(|l| l.0.iter().any(|n| n == node))
    }
}

/// A fabric investigation as the API answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FabricInvestigation {
    pub id: Uuid,
    pub state: InvestigationState,
    pub label: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it failed.
    pub error: Option<String>,
    /// The suspects as given, expanded.
    pub suspects: Vec<String>,
    /// Nodes the planner may test: enrolled, online, in the fabric, and idle unless told
    /// otherwise.
    pub nodes_available: u32,
    pub max_nodes: u32,
    pub max_rounds: u32,
    /// The round running or last run.
    pub round: u32,
    pub tests: Vec<FabricTest>,
    /// What it blames, where, and how sure it is; empty until it is done.
    pub blamed: Vec<FabricPart>,
    /// When the answer is not conclusive: what the failures might be.
    pub candidates: Vec<FabricPart>,
    pub conclusive: Option<bool>,
    /// What it left out, why it stopped, what observed jobs it took.
    pub notes: Vec<String>,
    pub node_seconds: f64,
}

/// Where `component` sits, in the fabric's terms, for people.
pub fn place(fabric: &Fabric, component: Kind, id: &str) -> String {
    match component {
        Kind::Node => format!("node {id}"),
        Kind::Nic => {
            let Some((node, nic)) = id.split_once('/') else {
                return format!("NIC {id}");
            };
            let found = fabric
                .nodes
                .iter()
                .find(|n| n.name == node)
                .and_then(|n| n.nics.iter().find(|k| k.name == nic));
            match found {
                Some(k) => {
                    let leaf = k.leaf.as_deref().unwrap_or("its leaf");
                    let port = k.port.map(|p| format!(" port {p}")).unwrap_or_default();
                    let rail = k.rail.map(|r| format!(", rail {r}")).unwrap_or_default();
                    format!("{leaf}{port} ↔ node {node} NIC {nic}{rail} (the NIC or its cable)")
                }
                None => format!("node {node} NIC {nic}"),
            }
        }
        Kind::Leaf => format!("leaf switch {id}"),
        Kind::Spine => format!("spine switch {id}"),
        Kind::Uplink => {
            let Some((a, b)) = id.split_once('~') else {
                return format!("uplink {id}");
            };
            if b == "*" {
                return format!(
                    "the uplinks of leaf {a} (ECMP spreads every test over all of them)"
                );
            }
            let ports = fabric
                .links
                .iter()
                .filter(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a))
                .map(|l| {
                    let (pa, pb) = if l.a == a {
                        (l.a_port, l.b_port)
                    } else {
                        (l.b_port, l.a_port)
                    };
                    let port = |p: Option<u32>| p.map(|p| format!(" port {p}")).unwrap_or_default();
                    format!("{a}{} ↔ {b}{}", port(pa), port(pb))
                })
                .collect::<Vec<_>>();
            match ports.len() {
                0 => format!("link {a} ↔ {b}"),
                1 => format!("link {}", ports[0]),
                n => format!("{n} links {}", ports.join(", ")),
            }
        }
    }
}

/// The nodes whose traffic crosses `component`: the node itself, a NIC's node, every node
/// with a NIC under a leaf (or under a leaf whose uplinks are meant), every node with a NIC
/// under a leaf cabled to a spine. Sorted.
pub fn behind(fabric: &Fabric, component: Kind, id: &str) -> Vec<String> {
    let leaves: BTreeSet<&str> = match component {
        Kind::Node => return vec![id.to_string()],
        Kind::Nic => return vec![id.split_once('/').map_or(id, |(n, _)| n).to_string()],
        Kind::Leaf => [id].into_iter().collect(),
        Kind::Uplink => {
            let (a, b) = id.split_once('~').unwrap_or((id, ""));
            let tier = |n: &str| fabric.switches.iter().find(|s| s.name == n).map(|s| s.tier);
            [a, b]
                .into_iter()
                .filter(|n| tier(n) == Some(Tier::Leaf))
                .collect()
        }
        Kind::Spine => fabric
            .links
            .iter()
            .filter_map(|l| {
                if l.a == id {
                    Some(l.b.as_str())
                } else if l.b == id {
                    Some(l.a.as_str())
                } else {
                    None
                }
            })
            .collect(),
    };
    fabric
        .nodes
        .iter()
        .filter(|n| {
            n.leaf.as_deref().is_some_and(|l| leaves.contains(l))
                || n.nics
                    .iter()
                    .any(|k| k.leaf.as_deref().is_some_and(|l| leaves.contains(l)))
        })
        .map(|n| n.name.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// A planner's blame in the fabric's terms.
pub fn part(fabric: &Fabric, b: &Blame) -> FabricPart {
    let nodes = behind(fabric, b.component, &b.id);
    FabricPart {
        component: b.component,
        id: b.id.clone(),
        confidence: b.confidence,
        place: place(fabric, b.component, &b.id),
        nodes: crate::hostlist::compress(&nodes),
        node_count: nodes.len() as u32,
        evidence: b.evidence.clone(),
    }
}

/// The answer's blamed components and candidates in the fabric's terms.
pub fn parts(fabric: &Fabric, a: &Answer) -> (Vec<FabricPart>, Vec<FabricPart>) {
    (
        a.blamed.iter().map(|b| part(fabric, b)).collect(),
        a.candidates.iter().map(|b| part(fabric, b)).collect(),
    )
}

/// How a drawing of the fabric marks one switch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mark {
    /// The switch itself is blamed (`true`), or a candidate.
    pub blamed: bool,
    pub candidate: bool,
    /// Its uplinks (all, or to the named spine) that are blamed (`maybe ...`: candidates).
    pub uplinks: Vec<String>,
    /// Nodes or NICs under it that are blamed (`n0042/mlx5_3`, `n0042`; `maybe ...`).
    pub below: Vec<String>,
}

/// What a drawing marks on each switch for these blamed parts and candidates: a leaf or
/// spine itself, a leaf's uplinks (on the leaf), a node or NIC (on the leaf it hangs off).
pub fn marks(
    fabric: &Fabric,
    blamed: &[FabricPart],
    candidates: &[FabricPart],
) -> std::collections::BTreeMap<String, Mark> {
    let mut out: std::collections::BTreeMap<String, Mark> = Default::default();
    for (parts, sure) in [(blamed, true), (candidates, false)] {
        for p in parts {
            match p.component {
                Kind::Leaf | Kind::Spine => {
                    let m = out.entry(p.id.clone()).or_default();
                    if sure {
                        m.blamed = true;
                    } else {
                        m.candidate = true;
                    }
                }
                Kind::Uplink => {
                    let (a, b) = p.id.split_once('~').unwrap_or((&p.id, "*"));
                    let is_leaf = |n: &str| {
                        fabric
                            .switches
                            .iter()
                            .any(|s| s.name == n && s.tier == Tier::Leaf)
                    };
                    let (leaf, other) = if is_leaf(a) { (a, b) } else { (b, a) };
                    let what = if other == "*" {
                        "every uplink".to_string()
                    } else {
                        format!("uplink to {other}")
                    };
                    let what = if sure { what } else { format!("maybe {what}") };
                    out.entry(leaf.to_string()).or_default().uplinks.push(what);
                }
                Kind::Node | Kind::Nic => {
                    let (node, nic) = p.id.split_once('/').unwrap_or((&p.id, ""));
                    let Some(n) = fabric.nodes.iter().find(|n| n.name == node) else {
                        continue;
                    };
                    let leaves: BTreeSet<&str> = n
                        .nics
                        .iter()
                        .filter(|k| nic.is_empty() || k.name == nic)
                        .filter_map(|k| k.leaf.as_deref())
                        .chain(n.leaf.as_deref())
                        .collect();
                    let what = if sure {
                        p.id.clone()
                    } else {
                        format!("maybe {}", p.id)
                    };
                    for l in leaves {
                        out.entry(l.to_string())
                            .or_default()
                            .below
                            .push(what.clone());
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::generate::{FatTree, fat_tree};

    #[test]
    fn components_are_named_where_they_are() {
        let mut f = fat_tree(&FatTree {
            nodes: 8,
            rails: 2,
            nodes_per_leaf: 4,
            spines_per_rail: 1,
        });
        f.nodes[1].nics[1].port = Some(17);
        f.links[0].a_port = Some(33);
        let nic = place(&f, Kind::Nic, "n0002/mlx5_1");
        assert_eq!(
            nic,
            "leaf-su0-r1 port 17 ↔ node n0002 NIC mlx5_1, rail 1 (the NIC or its cable)"
        );
        let (a, b) = (f.links[0].a.clone(), f.links[0].b.clone());
        let mut names = [a.clone(), b.clone()];
        names.sort();
        let up = place(&f, Kind::Uplink, &names.join("~"));
        assert!(up.contains(&format!("{a} port 33")), "{up}");
        assert_eq!(
            behind(&f, Kind::Leaf, "leaf-su1-r0"),
            ["n0005", "n0006", "n0007", "n0008"]
        );
        assert_eq!(behind(&f, Kind::Spine, "spine-r0-0").len(), 8);
        assert_eq!(behind(&f, Kind::Uplink, "leaf-su0-r1~*").len(), 4);
        assert_eq!(behind(&f, Kind::Nic, "n0003/mlx5_0"), ["n0003"]);
        let p = part(
            &f,
            &Blame {
                component: Kind::Leaf,
                id: "leaf-su1-r0".into(),
                confidence: 0.99,
                evidence: vec![],
            },
        );
        assert_eq!((p.nodes.as_str(), p.node_count), ("n[0005-0008]", 4));

        let blamed = [
            p.clone(),
            FabricPart {
                component: Kind::Nic,
                id: "n0002/mlx5_1".into(),
                ..p.clone()
            },
        ];
        let candidates = [FabricPart {
            component: Kind::Uplink,
            id: "leaf-su0-r0~*".into(),
            ..p.clone()
        }];
        let m = marks(&f, &blamed, &candidates);
        assert!(m["leaf-su1-r0"].blamed && !m["leaf-su1-r0"].candidate);
        assert_eq!(
            m["leaf-su0-r1"].below,
            ["n0002/mlx5_1"],
            "a NIC on its own leaf only"
        );
        assert_eq!(m["leaf-su0-r0"].uplinks, ["maybe every uplink"]);
        assert!(!m.contains_key("spine-r0-0"));
    }

    #[test]
    fn a_spine_covers_every_node_behind_it_past_the_command_lines_bound() {
        let f = fat_tree(&FatTree {
            nodes: 5000,
            rails: 1,
            nodes_per_leaf: 32,
            spines_per_rail: 1,
        });
        let p = part(
            &f,
            &Blame {
                component: Kind::Spine,
                id: "spine-r0-0".into(),
                confidence: 1.0,
                evidence: vec![],
            },
        );
        assert_eq!(p.node_count, 5000);
        assert!(p.covers("n4999") && p.covers("n0001") && !p.covers("n5001"));
    }
}
