//! The one place where the agent loop obtains node facts, so the loop does not depend on
//! how they are collected ([`crate::facts`] does that).

use std::path::Path;

use heddle_types::facts::NodeFacts;
use serde_json::Value;

use crate::facts::{CollectOptions, collect as collect_facts, facts_sha256};

/// A facts document and the hash the agent reports in heartbeats.
#[derive(Debug, Clone)]
pub struct FactsDoc {
    pub facts: NodeFacts,
    pub json: Value,
    pub sha256: String,
}

/// Collects the facts of the node whose filesystem is at `root` (`/` for the live node).
/// Blocking (sysfs, NVML, verbs): call it from a blocking thread. `hostname` is the name
/// the agent enrolled under; it replaces the one read from `root`, so the server sees one
/// name for the node.
pub fn collect(hostname: &str, root: &Path) -> FactsDoc {
    let mut facts = collect_facts(&CollectOptions::for_root(root));
    facts.host.hostname = hostname.to_string();
    let sha256 = facts_sha256(&facts);
    let json = serde_json::to_value(&facts).expect("facts always serialize");
    FactsDoc {
        facts,
        json,
        sha256,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_collection_time_but_not_content() {
        let root = Path::new("/");
        let a = collect("node-a", root);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let a2 = collect("node-a", root);
        assert_ne!(a.json["collected_at"], a2.json["collected_at"]);
        assert_eq!(a.sha256, a2.sha256);
        assert_ne!(a.sha256, collect("node-b", root).sha256);
        assert_eq!(a.sha256.len(), 64);
        assert_eq!(a.json["host"]["hostname"], "node-a");
    }
}
