//! The site's fabric as the server keeps it: what `PUT /api/v1/fabric` takes (a source
//! and its text, read by the importers of this crate on the server), the summary it answers
//! with, the stored document `GET /api/v1/fabric` returns, and the switch tree people read
//! from it (`heddle fabric show`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Errors, Fabric, Note, Tier, import};
use crate::env_policy::is_hidden;

/// The most notes a summary quotes; the rest are counted.
pub const SUMMARY_NOTES: usize = 20;

/// Where a fabric's text comes from, and so which reader takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum FabricSource {
    /// The Heddle fabric file (JSON, docs/fabric.md).
    Heddle,
    /// Slurm's `topology.conf` for `topology/tree`.
    SlurmTopology,
    /// `ibnetdiscover`'s topology file.
    Ibnetdiscover,
}

impl FabricSource {
    pub fn as_str(self) -> &'static str {
        match self {
            FabricSource::Heddle => "heddle",
            FabricSource::SlurmTopology => "slurm-topology",
            FabricSource::Ibnetdiscover => "ibnetdiscover",
        }
    }

    /// Reads `text` as this source says: refused when a line holds a control or invisible
    /// character (tabs aside), else each source's own reader and the fabric's checks.
    /// Every error names its line or item.
    pub fn read(self, text: &str) -> Result<Fabric, Errors> {
        check_characters(text)?;
        match self {
            FabricSource::Heddle => Fabric::from_json(text.as_bytes()),
            FabricSource::SlurmTopology => import::slurm_topology(text),
            FabricSource::Ibnetdiscover => import::ibnetdiscover(text),
        }
    }
}

impl std::fmt::Display for FabricSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FabricSource {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "heddle" => Ok(FabricSource::Heddle),
            "slurm-topology" => Ok(FabricSource::SlurmTopology),
            "ibnetdiscover" => Ok(FabricSource::Ibnetdiscover),
            other => Err(format!(
                "{other:?} is not a fabric source: heddle, slurm-topology or ibnetdiscover"
            )),
        }
    }
}

/// Text that holds a control character (other than tab, and the line ends), or one that
/// reads differently from what it is, is no topology file: each such line is named.
fn check_characters(text: &str) -> Result<(), Errors> {
    let mut errors = super::ErrorList::default();
    for (no, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(c) = line.chars().find(|&c| c != '\t' && is_hidden(c)) {
            errors.push(format!(
                "line {}: holds the control or invisible character U+{:04X}; a topology file \
                 is plain text",
                no + 1,
                u32::from(c)
            ));
        }
    }
    errors.finish()
}

/// The body of `PUT /api/v1/fabric`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FabricImport {
    pub source: FabricSource,
    /// The file as the source writes it (for `heddle`, the JSON document as text).
    pub text: String,
}

/// What is stored, in counts, with the first notes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FabricSummary {
    pub source: FabricSource,
    pub imported_at: DateTime<Utc>,
    /// The token (or session) that imported it.
    pub imported_by: String,
    pub nodes: usize,
    pub switches: usize,
    pub links: usize,
    /// How many notes the fabric holds; the first [`SUMMARY_NOTES`] are `first_notes`.
    pub notes: usize,
    pub first_notes: Vec<Note>,
}

impl FabricSummary {
    pub fn of(
        fabric: &Fabric,
        source: FabricSource,
        imported_at: DateTime<Utc>,
        imported_by: String,
    ) -> FabricSummary {
        FabricSummary {
            source,
            imported_at,
            imported_by,
            nodes: fabric.nodes.len(),
            switches: fabric.switches.len(),
            links: fabric.links.len(),
            notes: fabric.notes.len(),
            first_notes: fabric.notes.iter().take(SUMMARY_NOTES).cloned().collect(),
        }
    }
}

/// The answer of `GET /api/v1/fabric`: the current fabric and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredFabric {
    pub summary: FabricSummary,
    pub fabric: Fabric,
}

/// One switch as a tree shows it: the switches below it and the nodes cabled to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSwitch {
    pub name: String,
    pub tier: Tier,
    /// Switches one tier or more below this one that a link joins to it, in link order.
    pub switches: Vec<String>,
    /// Nodes whose `leaf`, or one of whose NICs' `leaf`, is this switch, in node order.
    pub nodes: Vec<String>,
}

fn rank(t: Tier) -> u8 {
    match t {
        Tier::Leaf => 0,
        Tier::Spine => 1,
        Tier::Core => 2,
    }
}

/// The fabric's switches from the top tier down (core, spine, leaf; the file's order within
/// a tier), each with its child switches and its nodes. A link between two switches of one
/// tier makes neither the other's child.
pub fn tree(fabric: &Fabric) -> Vec<TreeSwitch> {
    use std::collections::HashMap;
    let index: HashMap<&str, usize> = fabric
        .switches
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut out: Vec<TreeSwitch> = fabric
        .switches
        .iter()
        .map(|s| TreeSwitch {
            name: s.name.clone(),
            tier: s.tier,
            switches: Vec::new(),
            nodes: Vec::new(),
        })
        .collect();
    for l in &fabric.links {
        let (Some(&a), Some(&b)) = (index.get(l.a.as_str()), index.get(l.b.as_str())) else {
            continue;
        };
        let (upper, lower) = match rank(out[a].tier).cmp(&rank(out[b].tier)) {
            std::cmp::Ordering::Greater => (a, b),
            std::cmp::Ordering::Less => (b, a),
            std::cmp::Ordering::Equal => continue,
        };
        let child = out[lower].name.clone();
        if !out[upper].switches.contains(&child) {
            out[upper].switches.push(child);
        }
    }
    for n in &fabric.nodes {
        let leaves = n
            .leaf
            .iter()
            .chain(n.nics.iter().filter_map(|nic| nic.leaf.as_ref()));
        // Names are unique, so a node already under a leaf is that leaf's last.
        for leaf in leaves {
            if let Some(&i) = index.get(leaf.as_str())
                && out[i].nodes.last() != Some(&n.name)
            {
                out[i].nodes.push(n.name.clone());
            }
        }
    }
    out.sort_by_key(|s| std::cmp::Reverse(rank(s.tier)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_their_text_and_name_bad_lines() {
        let slurm =
            "SwitchName=s0 Nodes=n1\nSwitchName=s1 Nodes=n[2-3]\nSwitchName=top Switches=s[0-1]\n";
        let f = FabricSource::SlurmTopology.read(slurm).unwrap();
        let t = tree(&f);
        assert_eq!(t[0].name, "top");
        assert_eq!(t[0].switches, ["s0", "s1"]);
        assert_eq!(t[2].nodes, ["n2", "n3"]);
        let errs = FabricSource::SlurmTopology
            .read("SwitchName=s0 Nodes=n1\nSwitchName=s1 Nodes=n2\u{7}\r\nSwitchName=x\u{202e} Nodes=y\n")
            .unwrap_err()
            .0;
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("line 2: holds") && errs[0].contains("U+0007"));
        assert!(errs[1].starts_with("line 3:") && errs[1].contains("U+202E"));
        // Windows line ends and tabs are text.
        assert!(
            FabricSource::SlurmTopology
                .read("SwitchName=s0\tNodes=n1\r\n")
                .is_ok()
        );
        let json = r#"{"switches": [{"name": "l0", "tier": "leaf"}], "nodes": [{"name": "n1", "nics": [{"name": "mlx5_0", "rail": 0, "leaf": "l0"}]}]}"#;
        let f = FabricSource::Heddle.read(json).unwrap();
        assert_eq!(tree(&f)[0].nodes, ["n1"]);
        assert!(FabricSource::Heddle.read("{").unwrap_err().0[0].contains("line 1"));
        assert_eq!(
            "slurm-topology".parse::<FabricSource>(),
            Ok(FabricSource::SlurmTopology)
        );
        assert_eq!(
            serde_json::to_string(&FabricSource::SlurmTopology).unwrap(),
            "\"slurm-topology\""
        );
    }
}
