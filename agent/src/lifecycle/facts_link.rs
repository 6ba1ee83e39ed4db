//! The one place where the agent loop obtains node facts, so the loop does not depend on
//! how they are collected ([`crate::facts`] does that).

use serde_json::Value;

use crate::facts::{CollectOptions, collect as collect_facts, facts_sha256};

/// A facts document and the hash the agent reports in heartbeats.
#[derive(Debug, Clone)]
pub struct FactsDoc {
    pub json: Value,
    pub sha256: String,
}

/// Collects the live node's facts. Blocking (sysfs, NVML, verbs): call it from a blocking
/// thread. `hostname` is the name the agent enrolled under; it replaces the kernel's in
/// the document, so the server sees one name for the node.
pub fn collect(hostname: &str) -> FactsDoc {
    let mut facts = collect_facts(&CollectOptions::default());
    facts.host.hostname = hostname.to_string();
    let sha256 = facts_sha256(&facts);
    let json = serde_json::to_value(&facts).expect("facts always serialize");
    FactsDoc { json, sha256 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_collection_time_but_not_content() {
        let a = collect("node-a");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let a2 = collect("node-a");
        assert_ne!(a.json["collected_at"], a2.json["collected_at"]);
        assert_eq!(a.sha256, a2.sha256);
        assert_ne!(a.sha256, collect("node-b").sha256);
        assert_eq!(a.sha256.len(), 64);
        assert_eq!(a.json["host"]["hostname"], "node-a");
    }
}
