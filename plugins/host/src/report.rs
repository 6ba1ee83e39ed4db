//! What a plugin call produced, in host-side (serde) types.

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    /// JSON pointers of the facts the plugin reads (contract 0.2); empty: the whole document.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvRecommendation {
    pub name: String,
    pub value: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuAffinity {
    pub gpu: u32,
    pub cpus: String,
    pub numa: Option<i32>,
    pub nic: Option<String>,
    pub netdev: Option<String>,
}

/// What a test should reach on the node (contract 0.2): results below `value` fail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Expectation {
    /// `<kind>.<test>`, e.g. `nccl.all_reduce`.
    pub test: String,
    /// `busbw_gbs`, `algbw_gbs`, ...
    pub metric: String,
    pub min_size_bytes: u64,
    pub value: f64,
    pub source: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    /// Ordered as the plugin returned them.
    pub traits: Vec<(String, String)>,
    pub env: Vec<EnvRecommendation>,
    pub affinity: Vec<GpuAffinity>,
    pub warnings: Vec<String>,
    /// Empty for 0.1 plugins.
    #[serde(default)]
    pub expectations: Vec<Expectation>,
}

impl Detection {
    pub fn is_empty(&self) -> bool {
        self.traits.is_empty()
            && self.env.is_empty()
            && self.affinity.is_empty()
            && self.warnings.is_empty()
            && self.expectations.is_empty()
    }

    /// Drops the recommendations that `heddle_types::env_policy` refuses (a variable that
    /// loads code or touches a file, control characters in a value or reason), each with a
    /// warning that names the plugin; the rest of the output stands. Returns how many went.
    pub fn drop_refused_env(&mut self, plugin: &str) -> usize {
        use heddle_types::env_policy::{check_text, check_var};
        let before = self.env.len();
        let mut warnings = Vec::new();
        self.env.retain(|e| {
            let verdict = check_var(&e.name, &e.value)
                .and_then(|()| check_text("reason", &e.name, &e.reason));
            match verdict {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(plugin, name = %e.name, error = %err, "plugin recommendation dropped");
                    warnings.push(format!(
                        "Heddle dropped the recommendation of {} by plugin {plugin}: {err}",
                        e.name
                    ));
                    false
                }
            }
        });
        self.warnings.extend(warnings);
        before - self.env.len()
    }

    /// Total bytes of every string, which is what the output cap limits.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    pub level: LogLevel,
    pub message: String,
}

/// Resources one call used: what the limits are checked against, and what benchmarks and the
/// dashboard show.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub fuel_consumed: u64,
    #[serde(with = "micros")]
    pub elapsed: Duration,
    /// Largest linear memory size reached, in bytes.
    pub peak_memory_bytes: usize,
    /// Whether the compiled component came from the cache.
    pub cache_hit: bool,
    pub logs_dropped: u64,
    pub stdout_dropped_bytes: u64,
    pub stderr_dropped_bytes: u64,
}

mod micros {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_micros().try_into().unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_micros(u64::deserialize(d)?))
    }
}

/// A successful `detect` call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Shared by every report of the same compiled plugin.
    pub plugin: std::sync::Arc<PluginInfo>,
    /// Lowercase hex sha256 of the component bytes.
    pub sha256: String,
    pub detection: Detection,
    pub usage: Usage,
    pub logs: Vec<LogRecord>,
    pub stdout: String,
    pub stderr: String,
}

/// What validating an uploaded component tells the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentInfo {
    pub plugin: PluginInfo,
    pub sha256: String,
    pub size_bytes: usize,
    /// The contract it implements, e.g. `heddle:plugin@0.1.0`.
    pub contract: String,
    /// Every import, sorted (all within the allow-list, or validation would have failed).
    pub imports: Vec<String>,
    pub compile_time: CompileTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileTime {
    /// Zero on a cache hit.
    pub micros: u64,
    pub cache_hit: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(d.drop_refused_env("sneaky"), 4);
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
