//! The agent protocol: enrollment, heartbeats, job leases, result upload, rendezvous.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::jobs::{JobSpec, Progress};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct EnrollRequest {
    pub enroll_token: String,
    pub hostname: String,
    #[serde(default)]
    pub agent_version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollResponse {
    pub agent_id: Uuid,
    pub node_id: Uuid,
    /// The agent's own credential; store it (0600) and present it as a bearer token.
    pub credential: String,
    pub heartbeat_interval_s: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    #[serde(default)]
    pub agent_version: Option<String>,
    /// sha256 of the facts the agent last collected; the server asks for them when it
    /// holds a different hash.
    #[serde(default)]
    pub facts_sha256: Option<String>,
    /// Jobs the agent is executing; their leases are renewed by this heartbeat.
    #[serde(default)]
    pub running_jobs: Vec<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatResponse {
    pub heartbeat_interval_s: u32,
    /// True when the server lacks the facts named by `facts_sha256`.
    pub send_facts: bool,
    /// Jobs among `running_jobs` the agent must stop (cancelled, or leased to another).
    pub cancel_jobs: Vec<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FactsAccepted {
    pub node_id: Uuid,
    pub facts_sha256: String,
    /// False when the server already held these exact facts.
    pub changed: bool,
}

/// A job handed to an agent. The agent owns it until `lease_expires_at` unless it renews.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobLease {
    pub job_id: Uuid,
    pub run_id: Uuid,
    pub spec: JobSpec,
    pub rank: i32,
    pub world_size: i32,
    pub attempt: i32,
    pub lease_expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LeaseRenew {
    #[serde(default)]
    pub progress: Option<Progress>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseRenewed {
    pub lease_expires_at: DateTime<Utc>,
    /// The job was cancelled: stop it and upload an outcome of `cancelled`.
    pub cancel: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadAccepted {
    pub result_id: Uuid,
    /// False when this upload key had been stored before (a retry).
    pub created: bool,
}

/// Opaque bytes (base64) passed from rank 0 to the other ranks of a run, e.g. an NCCL
/// unique id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RendezvousBlob {
    pub blob_b64: String,
}
