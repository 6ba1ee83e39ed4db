//! Plugins as the API shows them, and what a plugin says about a node ([`Detection`]): one
//! shape used by the plugin host that produces it, the server that stores, diffs and judges
//! it, the agent's `detect` and the CLI and dashboard that show it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Plugin {
    pub id: Uuid,
    pub name: String,
    pub enabled: bool,
    /// The version that runs when the plugin is enabled.
    pub active_version: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginVersion {
    pub id: Uuid,
    pub plugin: String,
    pub version: String,
    pub sha256: String,
    pub size_bytes: i64,
    /// The contract it implements, e.g. `heddle:plugin@0.1.0`.
    pub contract: Option<String>,
    /// What the plugin says it does (from its `info()`).
    pub description: Option<String>,
    pub uploaded_by: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PluginEnable {
    /// Version to activate (also how a rollback is done); the newest when absent.
    #[serde(default)]
    pub version: Option<String>,
}

/// What one plugin said about one node (or why it could not say anything).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PluginOutcome {
    pub node_id: Uuid,
    pub hostname: String,
    pub plugin: String,
    pub version: String,
    /// Absent when the plugin failed.
    pub output: Option<Detection>,
    pub error: Option<String>,
    /// Fuel consumed, elapsed µs, peak memory bytes, cache hit.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub usage: serde_json::Value,
    pub ran_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DryRunRequest {
    /// Node ids or hostnames; every node with facts when absent.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    /// At most this many nodes (default 500).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// How a candidate version's output differs from what is active on a node now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputDiff {
    /// `NAME=value` lines only the candidate sets.
    pub env_added: Vec<String>,
    /// `NAME=value` lines only the active version sets.
    pub env_removed: Vec<String>,
    /// `NAME: old -> new`.
    pub env_changed: Vec<String>,
    pub traits_added: Vec<String>,
    pub traits_removed: Vec<String>,
    pub traits_changed: Vec<String>,
    pub warnings_added: Vec<String>,
    pub warnings_removed: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DryRunNode {
    pub node_id: Uuid,
    pub hostname: String,
    pub output: Option<Detection>,
    pub error: Option<String>,
    /// The version active on this node now, if any.
    pub active_version: Option<String>,
    pub diff: OutputDiff,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub usage: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DryRunReport {
    pub plugin: String,
    pub version: String,
    pub nodes: Vec<DryRunNode>,
    /// Nodes whose output differs from the active one.
    pub changed: usize,
    pub failed: usize,
}

/// What one plugin call says about a node. The JSON is what `plugin_results.output` stores
/// and the API returns: `{traits: [[k, v]...], env: [{name, value, reason}], affinity:
/// [{gpu, cpus, numa, nic, netdev}], warnings: [...], expectations: [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default)]
pub struct Detection {
    /// `[key, value]` pairs, ordered as the plugin returned them.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Vec<String>>))]
    pub traits: Vec<(String, String)>,
    pub env: Vec<EnvRecommendation>,
    pub affinity: Vec<GpuAffinity>,
    pub warnings: Vec<String>,
    /// Empty for plugins of contract 0.1.
    pub expectations: Vec<Expectation>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvRecommendation {
    pub name: String,
    pub value: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = PluginGpuAffinity))]
pub struct GpuAffinity {
    pub gpu: u32,
    pub cpus: String,
    pub numa: Option<i32>,
    pub nic: Option<String>,
    pub netdev: Option<String>,
}

/// What a test should reach on the node (contract 0.2): results below `value` fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = PluginExpectation))]
pub struct Expectation {
    /// `<kind>.<test>`, e.g. `nccl.all_reduce`.
    pub test: String,
    /// `busbw_gbs`, `algbw_gbs`, ...
    pub metric: String,
    #[serde(default)]
    pub min_size_bytes: u64,
    pub value: f64,
    pub source: String,
}

impl Detection {
    pub fn is_empty(&self) -> bool {
        self.traits.is_empty()
            && self.env.is_empty()
            && self.affinity.is_empty()
            && self.warnings.is_empty()
            && self.expectations.is_empty()
    }

    /// The traits as a map; of two pairs with one key the later one counts.
    pub fn trait_map(&self) -> BTreeMap<String, String> {
        self.traits.iter().cloned().collect()
    }

    /// The recommendations by name; of two with one name the later one counts.
    pub fn env_map(&self) -> BTreeMap<String, String> {
        self.env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect()
    }

    /// Drops the recommendations that [`crate::env_policy`] refuses (a variable that loads
    /// code or touches a file, control characters in a value or reason), each with a warning
    /// that names the plugin; the rest of the output stands. Returns each dropped name with
    /// the reason, for the caller to log.
    pub fn drop_refused_env(&mut self, plugin: &str) -> Vec<(String, crate::env_policy::EnvError)> {
        use crate::env_policy::{check_text, check_var};
        let mut dropped = Vec::new();
        self.env.retain(|e| {
            match check_var(&e.name, &e.value)
                .and_then(|()| check_text("reason", &e.name, &e.reason))
            {
                Ok(()) => true,
                Err(err) => {
                    dropped.push((e.name.clone(), err));
                    false
                }
            }
        });
        self.warnings.extend(dropped.iter().map(|(name, err)| {
            format!("Heddle dropped the recommendation of {name} by plugin {plugin}: {err}")
        }));
        dropped
    }

    /// Total bytes of every string, which is what the plugin host's output cap limits.
    pub fn output_bytes(&self) -> usize {
        self.traits
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
            + self
                .env
                .iter()
                .map(|e| e.name.len() + e.value.len() + e.reason.len())
                .sum::<usize>()
            + self
                .affinity
                .iter()
                .map(|a| {
                    8 + a.cpus.len()
                        + a.nic.as_ref().map_or(0, String::len)
                        + a.netdev.as_ref().map_or(0, String::len)
                })
                .sum::<usize>()
            + self.warnings.iter().map(String::len).sum::<usize>()
            + self
                .expectations
                .iter()
                .map(|e| 16 + e.test.len() + e.metric.len() + e.source.len())
                .sum::<usize>()
    }
}

impl OutputDiff {
    /// How a candidate output differs from the active one (`None`: no output).
    pub fn between(active: Option<&Detection>, candidate: Option<&Detection>) -> OutputDiff {
        let map = |d: Option<&Detection>, f: fn(&Detection) -> BTreeMap<String, String>| {
            d.map(f).unwrap_or_default()
        };
        let (env_added, env_removed, env_changed) = diff_maps(
            &map(active, Detection::env_map),
            &map(candidate, Detection::env_map),
        );
        let (traits_added, traits_removed, traits_changed) = diff_maps(
            &map(active, Detection::trait_map),
            &map(candidate, Detection::trait_map),
        );
        let warnings = |d: Option<&Detection>| d.map(|d| d.warnings.clone()).unwrap_or_default();
        let (old_w, new_w) = (warnings(active), warnings(candidate));
        OutputDiff {
            env_added,
            env_removed,
            env_changed,
            traits_added,
            traits_removed,
            traits_changed,
            warnings_added: new_w
                .iter()
                .filter(|w| !old_w.contains(w))
                .cloned()
                .collect(),
            warnings_removed: old_w
                .iter()
                .filter(|w| !new_w.contains(w))
                .cloned()
                .collect(),
        }
    }
}

/// `(added, removed, changed)` as `k=v`, `k=v` and `k: old -> new` lines.
fn diff_maps(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let added = new
        .iter()
        .filter(|(k, _)| !old.contains_key(*k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let removed = old
        .iter()
        .filter(|(k, _)| !new.contains_key(*k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let changed = new
        .iter()
        .filter_map(|(k, v)| {
            old.get(k)
                .filter(|o| *o != v)
                .map(|o| format!("{k}: {o} -> {v}"))
        })
        .collect();
    (added, removed, changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Detection {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn diff_names_what_changes() {
        let active = parse(json!({"traits": [["cloud", "azure"], ["sku", "ND40rs_v2"]],
            "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": ""}, {"name": "OLD", "value": "1", "reason": ""}],
            "warnings": ["w1"]}));
        let candidate = parse(
            json!({"traits": [["cloud", "azure"], ["sku", "ND96asr_v4"]],
            "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_1", "reason": ""}, {"name": "NEW", "value": "2", "reason": ""}],
            "warnings": ["w2"]}),
        );
        let d = OutputDiff::between(Some(&active), Some(&candidate));
        assert_eq!(d.env_added, ["NEW=2"]);
        assert_eq!(d.env_removed, ["OLD=1"]);
        assert_eq!(d.env_changed, ["NCCL_IB_HCA: mlx5_0 -> mlx5_1"]);
        assert_eq!(d.traits_changed, ["sku: ND40rs_v2 -> ND96asr_v4"]);
        assert!(d.traits_added.is_empty() && d.traits_removed.is_empty());
        assert_eq!(
            (d.warnings_added.as_slice(), d.warnings_removed.as_slice()),
            (&["w2".to_string()][..], &["w1".to_string()][..])
        );
        assert_eq!(
            OutputDiff::between(Some(&active), Some(&active)),
            OutputDiff::default()
        );
        assert_eq!(OutputDiff::between(None, Some(&active)).env_added.len(), 2);
    }

    #[test]
    fn the_stored_json_keeps_its_shape() {
        let stored = json!({
            "traits": [["cloud", "azure"]],
            "env": [{"name": "NCCL_IB_HCA", "value": "=mlx5_0", "reason": "r"}],
            "affinity": [{"gpu": 0, "cpus": "0-3", "numa": null, "nic": "mlx5_0", "netdev": null}],
            "warnings": ["w"],
            "expectations": [{"test": "nccl.all_reduce", "metric": "busbw_gbs",
                "min_size_bytes": 268435456u64, "value": 300.0, "source": "s"}]
        });
        let d = parse(stored.clone());
        assert_eq!(serde_json::to_value(&d).unwrap(), stored);
        // Outputs stored by 0.1 plugins carry no expectations.
        let old = parse(json!({"traits": [], "env": [], "affinity": [], "warnings": []}));
        assert!(old.is_empty());
    }

    #[test]
    fn refused_recommendations_are_dropped_with_a_warning_naming_the_plugin() {
        let rec = |name: &str, value: &str, reason: &str| EnvRecommendation {
            name: name.into(),
            value: value.into(),
            reason: reason.into(),
        };
        let mut d = Detection {
            env: vec![
                rec("NCCL_IB_HCA", "mlx5_0", "ok"),
                rec("LD_PRELOAD", "/tmp/x.so", ""),
                rec("NCCL_NET_PLUGIN", "evil", ""),
                rec("NCCL_ALGO", "Ring\ntouch /tmp/pwned", ""),
                rec("NCCL_PROTO", "LL", "two\nlines"),
            ],
            ..Detection::default()
        };
        assert_eq!(d.drop_refused_env("sneaky").len(), 4);
        assert_eq!(d.env.len(), 1);
        assert_eq!(d.env[0].name, "NCCL_IB_HCA");
        assert_eq!(d.warnings.len(), 4);
        assert!(
            d.warnings.iter().all(|w| w.contains("plugin sneaky")),
            "{:?}",
            d.warnings
        );
        assert!(d.warnings[0].contains("LD_PRELOAD"), "{:?}", d.warnings);
    }

    #[test]
    fn output_bytes_counts_every_string() {
        let d = Detection {
            traits: vec![("ab".into(), "cde".into())],
            env: vec![EnvRecommendation {
                name: "N".into(),
                value: "vv".into(),
                reason: "rrr".into(),
            }],
            affinity: vec![GpuAffinity {
                gpu: 0,
                cpus: "0-3".into(),
                numa: None,
                nic: Some("m".into()),
                netdev: None,
            }],
            warnings: vec!["w".into()],
            expectations: vec![Expectation {
                test: "nccl.all_reduce".into(),
                metric: "busbw_gbs".into(),
                min_size_bytes: 1 << 28,
                value: 300.0,
                source: "s".into(),
            }],
        };
        assert_eq!(
            d.output_bytes(),
            5 + 6 + (8 + 3 + 1) + 1 + (16 + 15 + 9 + 1)
        );
    }
}
