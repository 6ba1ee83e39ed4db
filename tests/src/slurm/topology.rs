//! The Slurm test's fabric: a `topology.conf` (`topology/tree`) for its node names, and
//! the switches as `scontrol show topology` prints them and as `heddle fabric show --json`
//! has them, in one shape to compare.

use std::collections::{BTreeMap, BTreeSet};

use heddle_types::fabric::stored::TreeSwitch;
use heddle_types::hostlist;

/// Two leaves (the last node name under `s1`, the others under `s0`) and a spine `s2`
/// above both.
pub fn topology_conf(nodes: &[&str]) -> String {
    let (last, rest) = nodes.split_last().expect("at least two node names");
    format!(
        "# Written by the Slurm test.\n\
         SwitchName=s0 Nodes={}\n\
         SwitchName=s1 Nodes={last}\n\
         SwitchName=s2 Switches=s[0-1]\n",
        rest.join(",")
    )
}

/// One switch as `scontrol show topology` describes it: its level (0 for a leaf), the
/// switches right below it, and every node below it at any depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Below {
    pub level: usize,
    pub switches: BTreeSet<String>,
    pub nodes: BTreeSet<String>,
}

fn names(list: &str) -> BTreeSet<String> {
    hostlist::expand(list)
        .unwrap_or_else(|e| panic!("{list:?}: {e}"))
        .0
        .into_iter()
        .collect()
}

/// `scontrol show topology`'s lines: `SwitchName=s2 Level=1 LinkSpeed=1 Nodes=hn-[1-3]
/// Switches=s[0-1]`.
pub fn parse_scontrol(text: &str) -> BTreeMap<String, Below> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.trim_start().starts_with("SwitchName="))
    {
        let fields: BTreeMap<&str, &str> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .collect();
        let below = Below {
            level: fields["Level"]
                .parse()
                .unwrap_or_else(|e| panic!("{line}: {e}")),
            switches: fields.get("Switches").map(|s| names(s)).unwrap_or_default(),
            nodes: fields.get("Nodes").map(|s| names(s)).unwrap_or_default(),
        };
        out.insert(fields["SwitchName"].to_string(), below);
    }
    out
}

/// The same from Heddle's switch tree: a switch's level is one above its highest child's,
/// its nodes those of every switch below it too.
pub fn from_tree(tree: &[TreeSwitch]) -> BTreeMap<String, Below> {
    let by_name: BTreeMap<&str, &TreeSwitch> = tree.iter().map(|s| (s.name.as_str(), s)).collect();
    fn walk(s: &TreeSwitch, by_name: &BTreeMap<&str, &TreeSwitch>, depth: usize) -> Below {
        assert!(depth < 16, "the switches loop at {}", s.name);
        let mut below = Below {
            level: 0,
            switches: s.switches.iter().cloned().collect(),
            nodes: s.nodes.iter().cloned().collect(),
        };
        for child in &s.switches {
            let c = walk(by_name[child.as_str()], by_name, depth + 1);
            below.level = below.level.max(c.level + 1);
            below.nodes.extend(c.nodes);
        }
        below
    }
    tree.iter()
        .map(|s| (s.name.clone(), walk(s, &by_name, 0)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scontrol_and_the_tree_agree_on_the_written_file() {
        let conf = topology_conf(&["hn-1", "hn-2", "hn-3"]);
        let fabric = heddle_types::fabric::import::slurm_topology(&conf).unwrap();
        let ours = from_tree(&heddle_types::fabric::stored::tree(&fabric));
        // As Slurm 22.05 prints it.
        let scontrol = "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=hn-[1-2]\n\
                        SwitchName=s1 Level=0 LinkSpeed=1 Nodes=hn-3\n\
                        SwitchName=s2 Level=1 LinkSpeed=1 Nodes=hn-[1-3] Switches=s[0-1]\n";
        assert_eq!(parse_scontrol(scontrol), ours);
    }
}
