use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What an API token may do. Ordered: each role can do everything the previous one can.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads everything except secrets.
    Viewer,
    /// Starts and cancels runs, manages sites and tuning profiles.
    Operator,
    /// Manages tokens, agents and plugins.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?} (expected viewer, operator or admin)"
            )),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TokenCreate {
    /// Unique name, e.g. `ci-pipeline`.
    pub name: String,
    pub role: Role,
    /// Days until the token stops working; never expires when absent.
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

/// A token as listed: never contains the secret.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenInfo {
    pub id: Uuid,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Returned once, at creation: the only time the secret is visible.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenCreated {
    #[serde(flatten)]
    pub info: TokenInfo,
    pub token: String,
}

/// Signs the dashboard in: the server keeps the token in an HttpOnly cookie.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionCreate {
    pub token: String,
}

/// Who the presented credential belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WhoAmI {
    pub name: String,
    pub role: Role,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EnrollmentTokenCreate {
    /// Free-form label, e.g. the rack or site the token is for.
    #[serde(default)]
    pub name: Option<String>,
    /// How many agents may enroll with it (default 1).
    #[serde(default)]
    pub max_uses: Option<u32>,
    /// Hours until it expires (default 1).
    #[serde(default)]
    pub expires_in_hours: Option<u32>,
    /// Binds the token to one host name: only that node may enroll with it, and it replaces
    /// the node's live agent without waiting for approval (a rebuilt host, a lost state
    /// directory).
    #[serde(default)]
    pub node: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollmentTokenInfo {
    pub id: Uuid,
    pub name: Option<String>,
    pub max_uses: i32,
    pub uses: i32,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// The host name the token is bound to, if any.
    #[serde(default)]
    pub node: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollmentTokenCreated {
    #[serde(flatten)]
    pub info: EnrollmentTokenInfo,
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentInfo {
    pub id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    pub version: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// `revoked`, else `online`, `stale` or `offline` from the heartbeat age: `state` on the
    /// wire and, deprecated, `health` ([`AgentStateFields`]).
    #[serde(flatten, with = "agent_state_fields")]
    #[cfg_attr(feature = "openapi", schema(value_type = AgentStateFields))]
    pub state: String,
}

/// An agent's state as the JSON carries it: `state`, and the same value under its first
/// name, `health`, deprecated, for clients that read that. Either is read back.
#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentStateFields<'a> {
    /// `revoked`, else `online`, `stale` or `offline` from the heartbeat age.
    pub state: &'a str,
    /// The same as `state`, under its first name.
    #[cfg_attr(feature = "openapi", schema(deprecated))]
    pub health: &'a str,
}

/// `#[serde(flatten, with = "agent_state_fields")]`: an agent's state written as
/// [`AgentStateFields`].
mod agent_state_fields {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::AgentStateFields;

    /// What is read: either name, or both.
    #[derive(Deserialize)]
    struct Read {
        state: Option<String>,
        health: Option<String>,
    }

    pub fn serialize<S: Serializer>(state: &str, s: S) -> Result<S::Ok, S::Error> {
        AgentStateFields {
            state,
            health: state,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let f = Read::deserialize(d)?;
        f.state
            .or(f.health)
            .ok_or_else(|| serde::de::Error::missing_field("state"))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: serde_json::Value,
}

/// An enrollment held because its host name already has a live agent. Nothing changes for
/// the node until an admin approves; the waiting agent then collects its credential and the
/// node's previous agent is revoked.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingEnrollment {
    pub id: Uuid,
    pub hostname: String,
    pub node_id: Uuid,
    pub agent_version: Option<String>,
    /// `pending`, `approved` (the newcomer has not collected its credential yet),
    /// `rejected` or `completed`.
    pub state: String,
    pub requested_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decided_by: Option<String>,
    /// The node's live agent, which approval would replace.
    pub live_agent_id: Option<Uuid>,
    pub live_agent_last_heartbeat_at: Option<DateTime<Utc>>,
    pub enrollment_token_id: Option<Uuid>,
}

#[cfg(test)]
mod agent_state_tests {
    use super::*;

    #[test]
    fn an_agents_state_is_written_under_both_names_and_read_from_either() {
        let agent = AgentInfo {
            id: Uuid::nil(),
            node_id: Uuid::nil(),
            hostname: "n1".into(),
            version: None,
            created_at: Utc::now(),
            last_heartbeat_at: None,
            revoked_at: None,
            state: "revoked".into(),
        };
        let json = serde_json::to_value(&agent).unwrap();
        assert_eq!(
            (&json["state"], &json["health"]),
            (&"revoked".into(), &"revoked".into())
        );
        for key in ["state", "health"] {
            let mut one = json.clone();
            one.as_object_mut().unwrap().remove(key);
            let back: AgentInfo = serde_json::from_value(one).unwrap();
            assert_eq!(back.state, "revoked", "without {key}");
        }
    }
}
