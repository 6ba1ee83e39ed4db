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
    /// The ticket of an enrollment held for approval ([`EnrollPending`]): asking again with
    /// it collects the credential once an admin has approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_ticket: Option<String>,
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

/// The answer (202) to an enrollment under the host name of a node whose agent is still
/// live: nothing is replaced until an admin approves. The agent asks again with `ticket`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollPending {
    pub pending_id: Uuid,
    pub hostname: String,
    /// Secret proof that a later request comes from the same agent; shown once.
    pub ticket: String,
    /// What to tell a person, e.g. `waiting for approval: heddle agents approve <id>`.
    pub message: String,
    /// How long to wait before asking again.
    pub retry_after_s: u32,
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
    /// Jobs the agent holds: executing, or finished with the result not yet stored (in its
    /// spool). Their leases are renewed by this heartbeat, so a result that waits out an
    /// outage keeps its job. At most 1,024.
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
    /// Version of the node's job environment (`nccl_conf::job_env_sha256`): when it differs
    /// from the one in the agent's node env file, the agent fetches `GET
    /// /api/v1/agent/env` and rewrites the file. Absent from servers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_env_sha256: Option<String>,
    /// The server's clock when it answered, in ns since the Unix epoch: the agent's
    /// measure of its node's clock offset (`observed::ClockOffset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_time_ns: Option<i64>,
}

/// A node's job environment as the agent writes it to the node env file
/// (`GET /api/v1/agent/env`, and for people `GET /api/v1/nodes/{node}/job-env`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeJobEnv {
    /// The node's hostname.
    pub node: String,
    /// `nccl_conf::job_env_sha256` of `entries`.
    pub job_env_sha256: String,
    pub entries: Vec<crate::nccl_conf::Entry>,
    /// Variables of the node's environment the file does not carry because ranks of one
    /// communicator must agree on them and the node's site does not (code
    /// `env-splits-communicator`). Not part of the version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<crate::must_agree::LeftOut>,
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
    /// Names this claim of the job. Renewals and the result carry it; once the job is
    /// claimed again, anything sent under an older claim is refused with 409.
    pub claim_id: Uuid,
    pub run_id: Uuid,
    pub spec: JobSpec,
    pub rank: i32,
    pub world_size: i32,
    pub attempt: i32,
    pub lease_expires_at: DateTime<Utc>,
    /// The lease's term in seconds, counted from when this answer was sent: what the agent
    /// times its renewals by, on its own monotonic clock, so that a node whose wall clock
    /// is off never misjudges `lease_expires_at` (which is on the server's clock, for
    /// people). Absent from servers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_s: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LeaseRenew {
    #[serde(default)]
    pub progress: Option<Progress>,
    /// The claim this renewal is for (`JobLease::claim_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_id: Option<Uuid>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseRenewed {
    pub lease_expires_at: DateTime<Utc>,
    /// The lease's term in seconds, counted from when this answer was sent: what the agent
    /// times its renewals by, on its own monotonic clock, so that a node whose wall clock
    /// is off never misjudges `lease_expires_at` (which is on the server's clock, for
    /// people). Absent from servers that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_s: Option<f64>,
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
