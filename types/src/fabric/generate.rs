//! Rail-optimized two-tier fat trees, for the simulator and its benchmark: nodes in
//! scalable units of `nodes_per_leaf`, one leaf per unit and rail (NIC `mlx5_r` of every node
//! of unit `u` goes to `leaf-su{u}-r{r}`), and each rail's leaves cabled to that rail's
//! `spines_per_rail` spines (`spine-r{r}-{j}`), non-blocking.

use super::{Fabric, Link, Nic, Node, Switch, Tier};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FatTree {
    pub nodes: usize,
    pub rails: u32,
    pub nodes_per_leaf: usize,
    pub spines_per_rail: usize,
}

/// Every NIC's rate, in Gbit/s.
pub const NIC_GBPS: f64 = 400.0;

/// Node `i` (from 0) of a generated fabric of `nodes`: `n0001`, or wider past 9999.
pub fn node_name(i: usize, nodes: usize) -> String {
    let width = nodes.to_string().len().max(4);
    format!("n{:0width$}", i + 1)
}

pub fn fat_tree(t: &FatTree) -> Fabric {
    let per_leaf = t.nodes_per_leaf.max(1);
    let units = t.nodes.div_ceil(per_leaf);
    let mut f = Fabric::default();
    for i in 0..t.nodes {
        let su = i / per_leaf;
        f.nodes.push(Node {
            name: node_name(i, t.nodes),
            nics: (0..t.rails)
                .map(|r| Nic {
                    name: format!("mlx5_{r}"),
                    rail: Some(r),
                    leaf: Some(format!("leaf-su{su}-r{r}")),
                    gbps: Some(NIC_GBPS),
                    ..Nic::default()
                })
                .collect(),
            leaf: None,
        });
    }
    let uplink = NIC_GBPS * per_leaf as f64 / t.spines_per_rail.max(1) as f64;
    for r in 0..t.rails {
        for su in 0..units {
            f.switches.push(Switch {
                name: format!("leaf-su{su}-r{r}"),
                tier: Tier::Leaf,
                guid: None,
            });
        }
        for j in 0..t.spines_per_rail {
            let spine = format!("spine-r{r}-{j}");
            f.switches.push(Switch {
                name: spine.clone(),
                tier: Tier::Spine,
                guid: None,
            });
            for su in 0..units {
                f.links.push(Link {
                    a: format!("leaf-su{su}-r{r}"),
                    b: spine.clone(),
                    gbps: Some(uplink),
                    ..Link::default()
                });
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_tree_is_a_valid_fabric() {
        let f = fat_tree(&FatTree {
            nodes: 1000,
            rails: 8,
            nodes_per_leaf: 32,
            spines_per_rail: 2,
        });
        f.check().unwrap();
        assert_eq!(f.nodes.len(), 1000);
        assert_eq!(f.switches.len(), 8 * (32 + 2));
        assert_eq!(f.links.len(), 8 * 32 * 2);
        assert_eq!(node_name(9999, 10_000), "n10000");
        assert_eq!(node_name(0, 10_000), "n00001");
    }
}
