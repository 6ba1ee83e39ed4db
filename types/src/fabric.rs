//! The fabric: nodes and their NICs by rail, switches by tier, the links between switches and
//! their rates. One shape (the plain Heddle file, [`Fabric`]) that every source is turned
//! into: Slurm's `topology.conf` and `ibnetdiscover` output ([`import`]), or a file written by
//! hand. [`index`] makes it something a planner can walk (numbered components, each test's
//! path); [`plan`] chooses the tests of an investigation and judges their results;
//! [`sim`] is the line protocol it speaks to a test oracle, and [`model`] and [`generate`]
//! the oracle's fabric and fat trees to run it on (docs/fabric.md); [`stored`] the shapes
//! of the fabric the server keeps.
//!
//! Pure functions only: no I/O, so the server, the CLI and the dashboard read it alike.

use serde::{Deserialize, Serialize};

use crate::names::HOSTNAME;

pub mod generate;
pub mod import;
pub mod index;
pub mod investigation;
pub mod model;
pub mod plan;
pub mod sim;
pub mod stored;

/// The largest Heddle fabric file read, in bytes (10,000 nodes with 8 NICs each are ~8 MB).
pub const MAX_FILE_BYTES: usize = 64 << 20;
/// The most nodes, switches, switch links and NICs of one node a fabric may hold.
pub const MAX_NODES: usize = 200_000;
pub const MAX_SWITCHES: usize = 100_000;
pub const MAX_LINKS: usize = 2_000_000;
pub const MAX_NICS_PER_NODE: usize = 64;
/// The most rails (a NIC's `rail` is below this).
pub const MAX_RAILS: u32 = 64;
/// Fastest link rate accepted, in Gbit/s (a typo of 4000000 is refused, not believed).
pub const MAX_GBPS: f64 = 100_000.0;
/// The most errors one check reports; the rest are counted.
const MAX_ERRORS: usize = 100;

/// The plain Heddle fabric file. Fields beyond these are allowed and ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Fabric {
    #[serde(default)]
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub switches: Vec<Switch>,
    /// Switch-to-switch links; a NIC's link to its leaf is the NIC's `leaf`.
    #[serde(default)]
    pub links: Vec<Link>,
    /// What an importer could not map or found in disagreement, per node or switch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<Note>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Node {
    pub name: String,
    #[serde(default)]
    pub nics: Vec<Nic>,
    /// The switch the node hangs off when its NICs are not known one by one (Slurm's
    /// `topology.conf` says only that much).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Nic {
    pub name: String,
    /// Which rail the NIC is on; `None` when no source said.
    #[serde(default)]
    pub rail: Option<u32>,
    /// The leaf switch its cable goes to.
    #[serde(default)]
    pub leaf: Option<String>,
    #[serde(default)]
    pub gbps: Option<f64>,
    /// The leaf's port number, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// The port GUID, when known (`0x` and 16 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guid: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Leaf,
    Spine,
    /// A tier above the spines: kept as imported, not planned over.
    Core,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Switch {
    pub name: String,
    pub tier: Tier,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guid: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Link {
    pub a: String,
    pub b: String,
    #[serde(default)]
    pub gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_port: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b_port: Option<u32>,
}

/// Something an importer says about one node or switch instead of guessing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Note {
    /// The node's or switch's name.
    pub subject: String,
    pub message: String,
}

/// Everything wrong with a fabric, one line per item, each naming where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Errors(pub Vec<String>);

impl std::fmt::Display for Errors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            f.write_str(e)?;
        }
        Ok(())
    }
}

impl std::error::Error for Errors {}

/// Collects errors up to [`MAX_ERRORS`], then counts the rest.
#[derive(Default)]
pub(crate) struct ErrorList {
    list: Vec<String>,
    more: usize,
}

impl ErrorList {
    pub(crate) fn push(&mut self, e: String) {
        if self.list.len() < MAX_ERRORS {
            self.list.push(e);
        } else {
            self.more += 1;
        }
    }

    pub(crate) fn finish(mut self) -> Result<(), Errors> {
        if self.list.is_empty() {
            return Ok(());
        }
        if self.more > 0 {
            self.list.push(format!("... and {} more errors", self.more));
        }
        Err(Errors(self.list))
    }
}

/// The one rule for the names of nodes, NICs and switches: a host name's, so that
/// component ids (`NODE/NIC`, `A~B`, `LEAF~*`) split back unambiguously.
pub fn check_name(name: &str) -> Result<(), String> {
    if HOSTNAME.allows(name) {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(format!("{shown:?} is not a name: {}", HOSTNAME.describe()))
    }
}

fn check_gbps(at: &str, gbps: Option<f64>, errors: &mut ErrorList) {
    if let Some(g) = gbps
        && (g.is_nan() || g <= 0.0 || g > MAX_GBPS)
    {
        errors.push(format!(
            "{at}.gbps: {g} is not a rate in (0, {MAX_GBPS}] Gbit/s"
        ));
    }
}

impl Fabric {
    /// Reads a Heddle fabric file: the JSON shape above, every error naming its item
    /// (`nodes[12].nics[3].leaf: ...`).
    pub fn from_json(bytes: &[u8]) -> Result<Fabric, Errors> {
        if bytes.len() > MAX_FILE_BYTES {
            return Err(Errors(vec![format!(
                "the file is {} bytes, more than the {MAX_FILE_BYTES} a fabric may be",
                bytes.len()
            )]));
        }
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let fabric: Fabric = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            Errors(vec![format!(
                "{path}: {inner} (line {}, column {})",
                inner.line(),
                inner.column()
            )])
        })?;
        fabric.check()?;
        Ok(fabric)
    }

    /// Every rule a fabric must meet: bounded sizes, names, unique names, references to
    /// switches that exist and are of the right tier, rails and rates in range.
    pub fn check(&self) -> Result<(), Errors> {
        let mut errors = ErrorList::default();
        for (what, len, max) in [
            ("nodes", self.nodes.len(), MAX_NODES),
            ("switches", self.switches.len(), MAX_SWITCHES),
            ("links", self.links.len(), MAX_LINKS),
        ] {
            if len > max {
                errors.push(format!("{what}: {len} of them, more than {max}"));
            }
        }
        if !errors.list.is_empty() {
            return errors.finish();
        }
        let mut tiers = std::collections::HashMap::new();
        for (i, s) in self.switches.iter().enumerate() {
            if let Err(e) = check_name(&s.name) {
                errors.push(format!("switches[{i}].name: {e}"));
            } else if tiers.insert(s.name.as_str(), s.tier).is_some() {
                errors.push(format!("switches[{i}].name: {:?} appears twice", s.name));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let at = format!("nodes[{i}]");
            if let Err(e) = check_name(&n.name) {
                errors.push(format!("{at}.name: {e}"));
            } else if !names.insert(n.name.as_str()) {
                errors.push(format!("{at}.name: {:?} appears twice", n.name));
            } else if tiers.contains_key(n.name.as_str()) {
                errors.push(format!("{at}.name: {:?} is a switch's name too", n.name));
            }
            if n.nics.len() > MAX_NICS_PER_NODE {
                errors.push(format!(
                    "{at}.nics: {} NICs, more than {MAX_NICS_PER_NODE}",
                    n.nics.len()
                ));
                continue;
            }
            if let Some(leaf) = &n.leaf {
                check_leaf(&format!("{at}.leaf"), leaf, &tiers, &mut errors);
            }
            let mut nic_names = std::collections::HashSet::new();
            let mut rails = std::collections::HashSet::new();
            for (j, nic) in n.nics.iter().enumerate() {
                let at = format!("{at}.nics[{j}]");
                if let Err(e) = check_name(&nic.name) {
                    errors.push(format!("{at}.name: {e}"));
                } else if !nic_names.insert(nic.name.as_str()) {
                    errors.push(format!("{at}.name: {:?} appears twice", nic.name));
                }
                if let Some(r) = nic.rail {
                    if r >= MAX_RAILS {
                        errors.push(format!("{at}.rail: {r} is not below {MAX_RAILS}"));
                    } else if !rails.insert(r) {
                        errors.push(format!("{at}.rail: a second NIC on rail {r}"));
                    }
                }
                if let Some(leaf) = &nic.leaf {
                    check_leaf(&format!("{at}.leaf"), leaf, &tiers, &mut errors);
                }
                check_gbps(&at, nic.gbps, &mut errors);
            }
        }
        for (i, l) in self.links.iter().enumerate() {
            let at = format!("links[{i}]");
            for (end, name) in [("a", &l.a), ("b", &l.b)] {
                if !tiers.contains_key(name.as_str()) {
                    let shown: String = name.chars().take(80).collect();
                    errors.push(format!("{at}.{end}: {shown:?} is not a switch of the file"));
                }
            }
            if l.a == l.b {
                errors.push(format!("{at}: a link from {:?} to itself", l.a));
            }
            check_gbps(&at, l.gbps, &mut errors);
        }
        errors.finish()
    }
}

fn check_leaf(
    at: &str,
    leaf: &str,
    tiers: &std::collections::HashMap<&str, Tier>,
    errors: &mut ErrorList,
) {
    match tiers.get(leaf) {
        Some(Tier::Leaf) => {}
        Some(t) => errors.push(format!("{at}: {leaf:?} is a {t:?} switch, not a leaf")),
        None => {
            let shown: String = leaf.chars().take(80).collect();
            errors.push(format!("{at}: {shown:?} is not a switch of the file"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_SHAPE: &str = r#"{"nodes": [{"name": "n0001", "nics": [{"name": "mlx5_0", "rail": 0, "leaf": "leaf-su0-r0", "gbps": 400}]}],
 "switches": [{"name": "leaf-su0-r0", "tier": "leaf"}, {"name": "spine-00", "tier": "spine"}],
 "links": [{"a": "leaf-su0-r0", "b": "spine-00", "gbps": 400}]}"#;

    #[test]
    fn the_documented_shape_reads_with_extra_fields() {
        let f = Fabric::from_json(ISSUE_SHAPE.as_bytes()).unwrap();
        assert_eq!(f.nodes[0].nics[0].rail, Some(0));
        assert_eq!(f.switches[1].tier, Tier::Spine);
        let extra = ISSUE_SHAPE.replace(
            r#""gbps": 400}]}]"#,
            r#""gbps": 400, "vendor": "x"}], "rack": 7}]"#,
        );
        assert_ne!(extra, ISSUE_SHAPE);
        let g = Fabric::from_json(format!("{{\"site\": 1, {}", &extra[1..]).as_bytes()).unwrap();
        assert_eq!(g.nodes, f.nodes);
    }

    #[test]
    fn each_bad_item_is_named() {
        let bad = r#"{"nodes": [{"name": "n1", "nics": [{"name": "a", "rail": 0, "leaf": "spine-00"},
            {"name": "a", "rail": 0, "leaf": "nowhere", "gbps": -1}]}, {"name": "n1"}, {"name": "bad name"}],
            "switches": [{"name": "spine-00", "tier": "spine"}],
            "links": [{"a": "spine-00", "b": "spine-00"}, {"a": "x", "b": "spine-00", "gbps": 1e9}]}"#;
        let errs = Fabric::from_json(bad.as_bytes()).unwrap_err().0;
        let want = [
            "nodes[0].nics[0].leaf: \"spine-00\" is a Spine switch",
            "nodes[0].nics[1].name: \"a\" appears twice",
            "nodes[0].nics[1].rail: a second NIC on rail 0",
            "nodes[0].nics[1].leaf: \"nowhere\" is not a switch",
            "nodes[0].nics[1].gbps: -1 is not a rate",
            "nodes[1].name: \"n1\" appears twice",
            "nodes[2].name: \"bad name\" is not a name",
            "links[0]: a link from \"spine-00\" to itself",
            "links[1].a: \"x\" is not a switch",
            "links[1].gbps: 1000000000 is not a rate",
        ];
        for w in want {
            assert!(errs.iter().any(|e| e.starts_with(w)), "{w}\n{errs:#?}");
        }
        assert_eq!(errs.len(), want.len(), "{errs:#?}");
    }

    #[test]
    fn decode_errors_name_the_path_and_line() {
        let e = Fabric::from_json(
            b"{\"nodes\": [{\"name\": \"n1\", \"nics\": [{\"name\": \"a\", \"rail\": \"x\"}]}]}",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("nodes[0].nics[0].rail: "), "{e}");
        assert!(e.contains("line 1"), "{e}");
        let e = Fabric::from_json(b"{\"switches\": [{\"name\": \"s\", \"tier\": \"top\"}]}")
            .unwrap_err();
        assert!(e.0[0].contains("unknown variant"), "{e}");
    }

    #[test]
    fn sizes_are_bounded_before_anything_else() {
        let big = vec![b' '; MAX_FILE_BYTES + 1];
        assert!(Fabric::from_json(&big).unwrap_err().0[0].contains("more than"));
        let f = Fabric {
            nodes: (0..MAX_NODES + 1).map(|_| Node::default()).collect(),
            ..Fabric::default()
        };
        let e = f.check().unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        let mut errors = ErrorList::default();
        for i in 0..500 {
            errors.push(i.to_string());
        }
        let e = errors.finish().unwrap_err().0;
        assert_eq!(e.len(), MAX_ERRORS + 1);
        assert_eq!(e.last().unwrap(), "... and 400 more errors");
    }
}
