//! Template detector: flags nodes whose GPUs are spread over more than one NUMA node and
//! recommends pinning. Replace the logic, keep the shape.
//!
//! Build: `cargo build --release --target wasm32-wasip2`
//! Try:   `heddle-agent detect --plugin target/wasm32-wasip2/release/my_heddle_plugin.wasm --root <fixture>`
//!        `heddle plugin test target/wasm32-wasip2/release/my_heddle_plugin.wasm --facts facts.json`

use std::collections::BTreeSet;

use heddle_plugin_sdk::{Detection, Facts, Info, Json, Plugin, PluginError, log};

pub struct MyPlugin;

impl Plugin for MyPlugin {
    fn info() -> Info {
        Info::new(
            "my-plugin",
            env!("CARGO_PKG_VERSION"),
            "Counts the NUMA nodes the GPUs sit on",
        )
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        let gpus = facts.entries("/gpus");
        if gpus.is_empty() {
            return Ok(d); // Not applicable: return an empty detection, not an error.
        }
        let numa: BTreeSet<u64> = gpus
            .iter()
            .filter_map(|(_, g)| g.get("numa_node").and_then(Json::as_u64))
            .collect();
        log::debug(&format!("{} GPUs on NUMA nodes {numa:?}", gpus.len()));
        d.add_trait("my.gpu_numa_nodes", &numa.len().to_string());
        if numa.len() > 1 {
            d.recommend(
                "NCCL_IGNORE_CPU_AFFINITY",
                "1",
                "GPUs span several NUMA nodes; pin each rank to its GPU's CPUs",
            );
            d.warn("cross-socket GPU traffic: check the affinity table");
        }
        Ok(d)
    }
}

heddle_plugin_sdk::export_plugin!(MyPlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_numa_nodes_recommend_pinning() {
        let facts = r#"{"gpus": [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": 1}]}"#;
        let d = heddle_plugin_sdk::run::<MyPlugin>(facts).unwrap();
        assert_eq!(d.trait_value("my.gpu_numa_nodes"), Some("2"));
        assert_eq!(d.env_value("NCCL_IGNORE_CPU_AFFINITY"), Some("1"));
    }

    #[test]
    fn no_gpus_means_not_applicable() {
        assert!(
            heddle_plugin_sdk::run::<MyPlugin>(r#"{"gpus": []}"#)
                .unwrap()
                .is_empty()
        );
    }
}
