//! The one place where the agent loop obtains node facts, so the loop does not depend on
//! how they are collected.
//!
//! Until the full collector in [`crate::facts`] is wired in here, this reports a minimal
//! document with the stable paths the server indexes (`/host/hostname`). The hash covers
//! the document without `collected_at`, so unchanged facts keep their hash.

use chrono::Utc;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A facts document and the hash the agent reports in heartbeats.
#[derive(Debug, Clone)]
pub struct FactsDoc {
    pub json: Value,
    pub sha256: String,
}

/// Collects the node's facts. Blocking (reads sysfs): call from a blocking thread.
pub fn collect(hostname: &str) -> FactsDoc {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .ok();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).ok();
    let json = json!({
        "schema_version": 1,
        "collected_at": Utc::now(),
        "live": true,
        "host": {"hostname": hostname, "kernel": kernel},
        "cpu": {"logical_cpus": cpus},
        "gpus": [],
        "rdma": {"devices": []},
    });
    FactsDoc {
        sha256: sha256_without_timestamp(&json),
        json,
    }
}

/// sha256 of the compact JSON, `collected_at` left out. serde_json keeps object keys
/// sorted (no `preserve_order`), so equal documents give equal bytes.
pub fn sha256_without_timestamp(doc: &Value) -> String {
    let mut doc = doc.clone();
    if let Some(obj) = doc.as_object_mut() {
        obj.remove("collected_at");
    }
    let bytes = serde_json::to_vec(&doc).expect("facts always serialize");
    hex::encode(Sha256::digest(&bytes))
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
