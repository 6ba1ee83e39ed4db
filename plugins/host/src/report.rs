//! What a plugin call produced, in host-side (serde) types.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a plugin says about a node is a wire shape of its own, shared with the server, the
/// agent and the CLI.
pub use heddle_types::plugins::{Detection, EnvRecommendation, Expectation, GpuAffinity};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    /// JSON pointers of the facts the plugin reads (contract 0.2); empty: the whole document.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<String>,
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
