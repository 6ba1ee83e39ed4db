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
