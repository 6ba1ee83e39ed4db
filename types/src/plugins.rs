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
    /// `{traits: [[k, v]...], env: [{name, value, reason}], affinity: [...], warnings: [...]}`;
    /// absent when the plugin failed.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub output: Option<serde_json::Value>,
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub output: Option<serde_json::Value>,
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
