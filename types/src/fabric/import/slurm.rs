//! Slurm's `topology.conf` for the `topology/tree` plugin: one `SwitchName=` line per
//! switch, with `Nodes=` (the nodes cabled to it, a hostlist) and/or `Switches=` (the
//! switches below it, a hostlist), `LinkSpeed=` (a relative weight, not a rate: ignored).
//! Keys are case-insensitive as Slurm reads them; `#` starts a comment; a line ending in
//! `\` continues on the next.

use std::collections::{BTreeMap, HashMap};

use super::{MAX_LINE_BYTES, lines, shown};
use crate::fabric::{
    ErrorList, Errors, Fabric, Link, MAX_NODES, MAX_SWITCHES, Node, Note, Switch, Tier, check_name,
};
use crate::hostlist;

struct Entry {
    line: usize,
    name: String,
    nodes: Vec<String>,
    switches: Vec<String>,
}

pub(super) fn parse(text: &str) -> Result<Fabric, Errors> {
    let mut errors = ErrorList::default();
    let mut entries: Vec<Entry> = Vec::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let mut node_count = 0usize;
    let mut pending = String::new();
    let mut pending_start = 0;
    for (no, raw) in lines(text)? {
        if raw.len() > MAX_LINE_BYTES {
            errors.push(format!(
                "line {no}: {} bytes, longer than the {MAX_LINE_BYTES} a line may be",
                raw.len()
            ));
            continue;
        }
        let line = raw.split('#').next().unwrap_or("");
        if pending.is_empty() {
            pending_start = no;
        }
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            if pending.len() > MAX_LINE_BYTES {
                errors.push(format!(
                    "line {no}: a continued line longer than {MAX_LINE_BYTES} bytes"
                ));
                pending.clear();
            }
            continue;
        }
        pending.push_str(line);
        let whole = std::mem::take(&mut pending);
        let no = pending_start;
        if whole.trim().is_empty() {
            continue;
        }
        match entry(no, &whole, MAX_NODES - node_count) {
            Ok(e) => {
                if entries.len() >= MAX_SWITCHES {
                    errors.push(format!("line {no}: more than {MAX_SWITCHES} switches"));
                    break;
                }
                if let Some(&first) = by_name.get(&e.name) {
                    errors.push(format!(
                        "line {no}: switch {:?} was defined on line {} already",
                        e.name, entries[first].line
                    ));
                    continue;
                }
                node_count += e.nodes.len();
                by_name.insert(e.name.clone(), entries.len());
                entries.push(e);
            }
            Err(e) => errors.push(format!("line {no}: {e}")),
        }
    }
    if !pending.trim().is_empty() {
        errors.push(format!(
            "line {pending_start}: the file ends inside a continued line"
        ));
    }
    // Which switch sits below which; every name in `Switches=` must be defined.
    let mut parent: HashMap<&str, &str> = HashMap::new();
    for e in &entries {
        for child in &e.switches {
            if !by_name.contains_key(child) {
                errors.push(format!(
                    "line {}: switch {:?} lists switch {child:?}, which no line defines",
                    e.line, e.name
                ));
            } else if child == &e.name {
                errors.push(format!("line {}: switch {:?} lists itself", e.line, e.name));
            } else if let Some(p) = parent.insert(child, &e.name) {
                errors.push(format!(
                    "line {}: switch {child:?} is below {p:?} already; a tree has one parent",
                    e.line
                ));
            }
        }
    }
    errors.finish()?;
    // Leaves are switches with nodes; a switch's tier is its height above them.
    let mut height: HashMap<&str, usize> = HashMap::new();
    for e in &entries {
        if !e.nodes.is_empty() {
            let mut at = e.name.as_str();
            let mut h = 0;
            height.entry(at).or_insert(0);
            while let Some(p) = parent.get(at) {
                h += 1;
                if h > entries.len() {
                    return Err(Errors(vec![format!(
                        "line {}: the switches above {:?} form a loop",
                        e.line, e.name
                    )]));
                }
                let cur = height.entry(p).or_insert(h);
                *cur = (*cur).max(h);
                at = p;
            }
        }
    }
    let mut fabric = Fabric::default();
    let mut leaf_of: BTreeMap<String, (String, usize)> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for e in &entries {
        let tier = match (e.nodes.is_empty(), height.get(e.name.as_str())) {
            (false, _) => Tier::Leaf,
            (true, Some(1)) => Tier::Spine,
            (true, Some(_)) => Tier::Core,
            (true, None) => {
                fabric.notes.push(Note {
                    subject: e.name.clone(),
                    message: format!(
                        "line {}: no node is below this switch; kept as a spine",
                        e.line
                    ),
                });
                Tier::Spine
            }
        };
        fabric.switches.push(Switch {
            name: e.name.clone(),
            tier,
            guid: None,
        });
        for child in &e.switches {
            fabric.links.push(Link {
                a: e.name.clone(),
                b: child.clone(),
                ..Link::default()
            });
        }
        for n in &e.nodes {
            match leaf_of.get(n) {
                None => {
                    leaf_of.insert(n.clone(), (e.name.clone(), e.line));
                    order.push(n.clone());
                }
                Some((first, line)) if first != &e.name => fabric.notes.push(Note {
                    subject: n.clone(),
                    message: format!(
                        "listed under switch {first:?} (line {line}) and {:?} (line {}): \
                         kept the first; a node with NICs on several leaves needs a \
                         port-level source (ibnetdiscover)",
                        e.name, e.line
                    ),
                }),
                Some(_) => {}
            }
        }
    }
    for n in order {
        let leaf = leaf_of.remove(&n).map(|(l, _)| l);
        fabric.notes.push(Note {
            subject: n.clone(),
            message: "NICs unmapped: topology.conf names the node's switch, not its NICs or rails"
                .into(),
        });
        fabric.nodes.push(Node {
            name: n,
            nics: Vec::new(),
            leaf,
        });
    }
    fabric.check()?;
    Ok(fabric)
}

/// One `SwitchName=` line.
fn entry(line: usize, text: &str, room: usize) -> Result<Entry, String> {
    let mut e = Entry {
        line,
        name: String::new(),
        nodes: Vec::new(),
        switches: Vec::new(),
    };
    let mut seen = Vec::new();
    for word in text.split_whitespace() {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| format!("{:?} is not KEY=VALUE", shown(word)))?;
        let key = key.to_ascii_lowercase();
        if seen.contains(&key) {
            return Err(format!("{key} appears twice"));
        }
        seen.push(key.clone());
        match key.as_str() {
            "switchname" => {
                check_name(value)?;
                e.name = value.to_string();
            }
            "nodes" => {
                e.nodes = hostlist::expand_at_most(value, room)?.0;
                for n in &e.nodes {
                    check_name(n)?;
                }
            }
            "switches" => {
                e.switches = hostlist::expand_at_most(value, MAX_SWITCHES)?.0;
                for n in &e.switches {
                    check_name(n)?;
                }
            }
            // A relative weight for Slurm (sites write `100Mb/s` too): not a rate.
            "linkspeed" => {}
            "blockname" | "blocksizes" => {
                return Err(
                    "BlockName=/BlockSizes= are the topology/block plugin's; only topology/tree \
                     (SwitchName=) is read"
                        .into(),
                );
            }
            _ => {
                return Err(format!(
                    "{:?} is not a key of topology.conf's tree lines",
                    shown(&key)
                ));
            }
        }
    }
    if e.name.is_empty() {
        return Err("a line without SwitchName=".into());
    }
    if e.nodes.is_empty() && e.switches.is_empty() {
        return Err(format!(
            "switch {:?} has neither Nodes= nor Switches=",
            e.name
        ));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::super::slurm_topology;
    use crate::fabric::Tier;

    /// The examples of Slurm's topology.conf(5) manual page (fixtures/fabric/README.md).
    const TREE: &str = include_str!("../../../tests/fixtures/fabric/slurm-topology-tree.conf");
    const BLOCK: &str = include_str!("../../../tests/fixtures/fabric/slurm-topology-block.conf");

    #[test]
    fn the_manual_examples_read() {
        let f = slurm_topology(TREE).unwrap();
        let tier = |n: &str| f.switches.iter().find(|s| s.name == n).unwrap().tier;
        assert_eq!(tier("s0"), Tier::Leaf);
        assert_eq!(tier("s2"), Tier::Leaf);
        assert_eq!(tier("s3"), Tier::Spine);
        assert_eq!(f.nodes.len(), 18);
        let n = f.nodes.iter().find(|n| n.name == "dev13").unwrap();
        assert_eq!(n.leaf.as_deref(), Some("s2"));
        assert_eq!(f.links.iter().filter(|l| l.a == "s3").count(), 3);
        // Every node says its NICs are not known.
        assert_eq!(
            f.notes
                .iter()
                .filter(|n| n.message.starts_with("NICs unmapped"))
                .count(),
            18
        );
        let three = "SwitchName=a Nodes=x[1-2]\nSwitchName=b Switches=a\nSwitchName=c Switches=b LinkSpeed=100Mb/s\n";
        assert_eq!(slurm_topology(three).unwrap().switches[2].tier, Tier::Core);
        let errs = slurm_topology(BLOCK).unwrap_err().0;
        assert_eq!(errs.len(), 5, "{errs:#?}");
        assert!(errs[0].starts_with("line 5: BlockName="), "{errs:#?}");
    }

    #[test]
    fn continuations_case_and_comments() {
        let f = slurm_topology("switchname=leaf1 nodes=gpu[01-02] # rack 1\nSwitchName=top \\\n  Switches=leaf1 LinkSpeed=100\n").unwrap();
        assert_eq!(f.nodes.len(), 2);
        assert_eq!(f.switches[1].tier, Tier::Spine);
    }

    #[test]
    fn disagreements_are_notes_per_node() {
        let f = slurm_topology("SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n2\n").unwrap();
        let n2: Vec<_> = f.notes.iter().filter(|n| n.subject == "n2").collect();
        assert!(
            n2.iter()
                .any(|n| n.message.contains("\"a\" (line 1) and \"b\" (line 2)")),
            "{n2:?}"
        );
        assert_eq!(f.nodes[1].leaf.as_deref(), Some("a"));
    }

    #[test]
    fn every_bad_line_is_named() {
        let text = "SwitchName=a Nodes=n[1-\nSwitchName=b Nodes=x Foo=1\nNodes=y\nSwitchName=c\nSwitchName=a Nodes=z\nSwitchName=d Switches=nowhere\nBlockName=b1 Nodes=q\nSwitchName=e Nodes=m LinkSpeed=fast\nSwitchName=bad/name Nodes=w\n";
        let errs = slurm_topology(text).unwrap_err().0;
        let want = [
            "line 1: \"n[1-\": '[' is not closed",
            "line 2: \"foo\" is not a key",
            "line 3: a line without SwitchName=",
            "line 4: switch \"c\" has neither",
            "line 6: switch \"d\" lists switch \"nowhere\"",
            "line 7: BlockName=",
            "line 9: \"bad/name\" is not a name",
        ];
        for w in want {
            assert!(errs.iter().any(|e| e.starts_with(w)), "{w}\n{errs:#?}");
        }
        // Line 5 repeats a switch only when line 1 was accepted; here it was not.
        assert_eq!(errs.len(), want.len(), "{errs:#?}");
        let errs = slurm_topology("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n")
            .unwrap_err()
            .0;
        assert_eq!(errs, ["line 2: switch \"a\" was defined on line 1 already"]);
    }

    #[test]
    fn hostile_sizes_are_refused_cheaply() {
        let e = slurm_topology("SwitchName=a Nodes=n[1-999999999999]\n").unwrap_err();
        assert!(e.0[0].contains("more than"), "{e}");
        let long = format!("SwitchName=a Nodes={}\n", "x".repeat(70_000));
        assert!(slurm_topology(&long).unwrap_err().0[0].contains("longer than"));
        let loop_ = "SwitchName=a Nodes=n1\nSwitchName=b Switches=a,c\nSwitchName=c Switches=b\n";
        assert!(slurm_topology(loop_).is_err());
        assert!(slurm_topology("SwitchName=a Switches=a\n").is_err());
        // 10,000 nodes on one line is a fabric, not an attack.
        let f = slurm_topology("SwitchName=a Nodes=n[00001-10000]\n").unwrap();
        assert_eq!(f.nodes.len(), 10_000);
    }
}
