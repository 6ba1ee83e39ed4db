//! A detector written against `heddle:plugin@0.1.0` without the SDK, frozen as a 0.1 plugin
//! would be in the wild. The host's tests run it next to 0.2 plugins to prove that releasing
//! a contract version does not break components built against the previous one.

wit_bindgen::generate!({
    path: "../../wit/v0.1",
    world: "heddle:plugin/detector",
});

use exports::heddle::plugin::plugin::{
    DetectedTrait, Detection, EnvRecommendation, Guest, PluginError, PluginInfo,
};

struct ContractV01;

impl Guest for ContractV01 {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "contract-v01".into(),
            version: "0.1.0".into(),
            description: "a 0.1 detector: names the GPU model and asks for NCCL debug output"
                .into(),
        }
    }

    fn detect(facts_json: String) -> Result<Detection, PluginError> {
        let facts: serde_json::Value =
            serde_json::from_str(&facts_json).map_err(|e| PluginError {
                code: "bad-facts".into(),
                message: e.to_string(),
            })?;
        heddle::plugin::log::log(heddle::plugin::log::Level::Info, "0.1 detector called");
        let mut traits = Vec::new();
        if let Some(name) = facts.pointer("/gpus/0/name").and_then(|v| v.as_str()) {
            traits.push(DetectedTrait {
                key: "v01.gpu_model".into(),
                value: name.into(),
            });
        }
        if let Some(host) = facts.pointer("/host/hostname").and_then(|v| v.as_str()) {
            traits.push(DetectedTrait {
                key: "v01.hostname".into(),
                value: host.into(),
            });
        }
        Ok(Detection {
            traits,
            env: vec![EnvRecommendation {
                name: "NCCL_DEBUG".into(),
                value: "WARN".into(),
                reason: "a 0.1 plugin's recommendation".into(),
            }],
            affinity: Vec::new(),
            warnings: Vec::new(),
        })
    }
}

export!(ContractV01);
