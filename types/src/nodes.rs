use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Whether a node's agent is heard from, by the age of its last heartbeat (the server's
/// `db::liveness` draws the lines): its liveness, in `heddle nodes` and on the fleet page.
/// Not its health, which is a verdict (`crate::health`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// No heartbeat, or none for a long while. Ordered first: the worst.
    Offline,
    /// Heartbeats late, not yet long gone.
    Stale,
    Online,
}

impl Liveness {
    pub const ALL: [Liveness; 3] = [Liveness::Online, Liveness::Stale, Liveness::Offline];

    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Online => "online",
            Liveness::Stale => "stale",
            Liveness::Offline => "offline",
        }
    }
}

impl std::fmt::Display for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Liveness {
    type Err = String;
    fn from_str(s: &str) -> Result<Liveness, String> {
        Liveness::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| format!("liveness {s:?} must be online, stale or offline"))
    }
}

/// A node's liveness as the JSON carries it: `liveness`, and the same value under its first
/// name, `health`, deprecated, for clients that read that. Either is read back.
#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LivenessFields {
    /// `online`, `stale` or `offline`, from the agent's heartbeat age.
    pub liveness: Liveness,
    /// The same as `liveness`, under its first name.
    #[cfg_attr(feature = "openapi", schema(deprecated))]
    pub health: Liveness,
}

/// `#[serde(flatten, with = "liveness_fields")]`: a [`Liveness`] written as
/// [`LivenessFields`].
mod liveness_fields {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Liveness, LivenessFields};

    /// What is read: either name, or both.
    #[derive(Deserialize)]
    struct Read {
        liveness: Option<Liveness>,
        health: Option<Liveness>,
    }

    pub fn serialize<S: Serializer>(l: &Liveness, s: S) -> Result<S::Ok, S::Error> {
        LivenessFields {
            liveness: *l,
            health: *l,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Liveness, D::Error> {
        let f = Read::deserialize(d)?;
        f.liveness
            .or(f.health)
            .ok_or_else(|| serde::de::Error::missing_field("liveness"))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeSummary {
    pub id: Uuid,
    pub hostname: String,
    pub site: Option<String>,
    /// The agent's liveness, from its heartbeat age: `liveness` on the wire and, deprecated,
    /// `health` ([`LivenessFields`]).
    #[serde(flatten, with = "liveness_fields")]
    #[cfg_attr(feature = "openapi", schema(value_type = LivenessFields))]
    pub liveness: Liveness,
    pub gpu_model: Option<String>,
    pub gpu_count: i32,
    pub hcas: Vec<String>,
    pub port_states: Vec<String>,
    pub link_layers: Vec<String>,
    pub traits: BTreeMap<String, String>,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub facts_updated_at: Option<DateTime<Utc>>,
}

impl NodeSummary {
    /// Why the node needs a look, most serious first; empty for a healthy node. A node is a
    /// problem when its agent is not online, it has sent no facts yet, or any of its ports
    /// is not `ACTIVE`. The server's `?problems=` filter is this rule in SQL
    /// (`server/src/api/node_list.rs`); `server/tests/lists.rs` holds the two together.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.liveness != Liveness::Online {
            out.push(format!("agent {}", self.liveness));
        }
        if self.facts_updated_at.is_none() {
            out.push("no facts yet".into());
        }
        let down: Vec<&str> = self
            .port_states
            .iter()
            .map(String::as_str)
            .filter(|s| *s != "ACTIVE")
            .collect();
        if !down.is_empty() {
            out.push(format!("ports {}", down.join(", ")));
        }
        out
    }
}

/// How many nodes match a filter of `GET /api/v1/nodes`, by health, out of the whole fleet:
/// what a page shows as "N of TOTAL nodes" while it holds only a page of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeCounts {
    /// Every node, whatever the filters.
    pub fleet: i64,
    /// Nodes that match the filters; the rest of the counts are of these.
    pub total: i64,
    pub online: i64,
    pub stale: i64,
    pub offline: i64,
    /// Matching nodes with a problem ([`NodeSummary::problems`]).
    pub problems: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeDetail {
    #[serde(flatten)]
    pub summary: NodeSummary,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub facts: Option<serde_json::Value>,
    pub facts_sha256: Option<String>,
    pub recommendations: Vec<Recommendation>,
    /// Every named check of the node's conditions (`heddle_types::node_checks`), passing
    /// ones included.
    #[serde(default)]
    pub checks: Vec<crate::node_checks::NodeCheck>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FactsSnapshot {
    pub id: i64,
    pub facts_sha256: String,
    pub collected_at: DateTime<Utc>,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub facts: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeUpdate {
    /// Site name to attach the node to; `null` detaches it.
    pub site: Option<String>,
}

/// An environment variable recommended for jobs on a node, and who recommended it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Recommendation {
    pub name: String,
    pub value: String,
    pub reason: String,
    /// `plugin:<name>@<version>` or `tuning:<profile>`.
    pub source: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RecommendationSet {
    /// Replaces every recommendation of this source on the node.
    pub source: String,
    pub items: Vec<RecommendationItem>,
    #[serde(default)]
    pub traits: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RecommendationItem {
    pub name: String,
    pub value: String,
    #[serde(default)]
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SiteCreate {
    pub name: String,
    #[serde(default)]
    pub traits: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Site {
    pub id: Uuid,
    pub name: String,
    pub traits: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TuningProfileCreate {
    pub name: String,
    /// Node (id or hostname) the profile applies to; a site-wide profile when absent.
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub site: Option<String>,
    pub env: BTreeMap<String, String>,
    /// The run whose results chose these values, if any.
    #[serde(default)]
    pub source_run_id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TuningProfile {
    pub id: Uuid,
    pub name: String,
    pub node_id: Option<Uuid>,
    pub site_id: Option<Uuid>,
    pub env: BTreeMap<String, String>,
    pub source_run_id: Option<Uuid>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> NodeSummary {
        NodeSummary {
            id: Uuid::nil(),
            hostname: "n1".into(),
            site: None,
            liveness: Liveness::Stale,
            gpu_model: None,
            gpu_count: 0,
            hcas: vec![],
            port_states: vec![],
            link_layers: vec![],
            traits: BTreeMap::new(),
            last_seen_at: None,
            facts_updated_at: None,
        }
    }

    #[test]
    fn liveness_is_written_under_both_names_and_read_from_either() {
        let json = serde_json::to_value(summary()).unwrap();
        assert_eq!(
            (&json["liveness"], &json["health"]),
            (&"stale".into(), &"stale".into())
        );
        for key in ["liveness", "health"] {
            let mut one = json.clone();
            one.as_object_mut().unwrap().remove(key);
            let back: NodeSummary = serde_json::from_value(one).unwrap();
            assert_eq!(back.liveness, Liveness::Stale, "without {key}");
        }
        let detail = NodeDetail {
            summary: summary(),
            facts: None,
            facts_sha256: None,
            recommendations: vec![],
            checks: vec![],
        };
        let json = serde_json::to_value(&detail).unwrap();
        assert_eq!(json["liveness"], "stale", "{json}");
        let back: NodeDetail = serde_json::from_value(json).unwrap();
        assert_eq!(back.summary.liveness, Liveness::Stale);
        let mut neither = serde_json::to_value(summary()).unwrap();
        neither.as_object_mut().unwrap().remove("liveness");
        neither.as_object_mut().unwrap().remove("health");
        assert!(serde_json::from_value::<NodeSummary>(neither).is_err());
    }
}
