//! What several modules read about plugins: an enabled plugin and its running version.

use uuid::Uuid;

/// An enabled plugin and the version of it that runs.
#[derive(Debug, Clone)]
pub struct Enabled {
    pub plugin_id: Uuid,
    pub name: String,
    pub version_id: Uuid,
    pub version: String,
    pub sha256: String,
}

impl Enabled {
    /// How its recommendations name their source: `plugin:<name>@<version>`.
    pub fn env_source(&self) -> String {
        format!("plugin:{}@{}", self.name, self.version)
    }

    /// How its traits name their source: `plugin:<name>`.
    pub fn traits_source(&self) -> String {
        format!("plugin:{}", self.name)
    }
}
