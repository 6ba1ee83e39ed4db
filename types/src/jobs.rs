use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::kinds::Params;

/// Life cycle of one job (the part of a run that one agent executes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Leased,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    /// Ended without running because the node lacks what the test needs (e.g. no RDMA device).
    Skipped,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Queued,
        JobState::Leased,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Leased => "leased",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Skipped => "skipped",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled | JobState::Skipped
        )
    }
}

impl std::str::FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown job state {s:?}"))
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Aggregate state of a run, derived from its jobs' states (never stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// No job has been claimed yet.
    Queued,
    /// Some job is leased or running.
    Running,
    Succeeded,
    /// Some job failed (and none is left to run).
    Failed,
    /// Some job was cancelled and none failed.
    Cancelled,
    /// Every job was skipped.
    Skipped,
}

impl RunState {
    pub const ALL: [RunState; 6] = [
        RunState::Queued,
        RunState::Running,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Cancelled,
        RunState::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
            RunState::Skipped => "skipped",
        }
    }

    /// Whether every job of the run has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunState::Queued | RunState::Running)
    }

    /// A run's state from its jobs' states.
    pub fn of(jobs: impl IntoIterator<Item = JobState>) -> RunState {
        let (mut live, mut claimed, mut failed, mut cancelled) = (false, false, false, false);
        let (mut any, mut all_skipped) = (false, true);
        for s in jobs {
            any = true;
            live |= !s.is_terminal();
            claimed |= matches!(s, JobState::Leased | JobState::Running);
            failed |= s == JobState::Failed;
            cancelled |= s == JobState::Cancelled;
            all_skipped &= s == JobState::Skipped;
        }
        if live {
            if claimed {
                RunState::Running
            } else {
                RunState::Queued
            }
        } else if failed {
            RunState::Failed
        } else if cancelled {
            RunState::Cancelled
        } else if any && all_skipped {
            RunState::Skipped
        } else {
            RunState::Succeeded
        }
    }
}

impl std::str::FromStr for RunState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown run state {s:?}"))
    }
}

/// Compares with the wire spelling, so callers holding a `&str` need no parse.
impl PartialEq<str> for RunState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RunState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to run. `kind` is a string (`nccl`, `rdma`, `ucx`, `p2p`, `sweep`, ...) so new test
/// types need no schema change; `params` are decoded by the kind's type in
/// [`crate::kinds`] when the spec is read, and written back as they were given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(from = "WireSpec")]
pub struct JobSpec {
    pub kind: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: Params,
    /// Environment applied to the test's child process (NCCL_*, UCX_*...).
    pub env: BTreeMap<String, String>,
    /// Wall-clock limit for the test on the agent.
    pub timeout_s: Option<u32>,
    /// Seconds without a row or progress event, beyond the slowest step the test
    /// declared, after which the agent stops it as `hung` (the agent's
    /// `--stall-limit` when unset; set here, it also watches kinds that declare no plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stall_s: Option<u32>,
}

impl JobSpec {
    /// A spec of `kind` with `params` as given, no env and no limits.
    pub fn new(kind: impl Into<String>, params: serde_json::Value) -> JobSpec {
        let kind = kind.into();
        JobSpec {
            params: Params::new(&kind, params),
            kind,
            env: BTreeMap::new(),
            timeout_s: None,
            stall_s: None,
        }
    }
}

/// A job spec as it is written: what [`JobSpec`] is read from.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireSpec {
    kind: String,
    #[serde(default)]
    params: serde_json::Value,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    timeout_s: Option<u32>,
    #[serde(default)]
    stall_s: Option<u32>,
}

impl From<WireSpec> for JobSpec {
    fn from(w: WireSpec) -> JobSpec {
        JobSpec {
            params: Params::new(&w.kind, w.params),
            kind: w.kind,
            env: w.env,
            timeout_s: w.timeout_s,
            stall_s: w.stall_s,
        }
    }
}

/// Request to start a run on one or more nodes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RunCreate {
    /// Test kind: `nccl`, `rdma`, `ucx`, `sweep`, `memcpy`...
    pub kind: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: serde_json::Value,
    /// Environment applied to the test's child process (NCCL_*, UCX_*...).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Wall-clock limit for the test on the agent.
    #[serde(default)]
    pub timeout_s: Option<u32>,
    /// Silence (no row, no progress) beyond the test's slowest step after which it is
    /// stopped as `hung`; the agent's `--stall-limit` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_s: Option<u32>,
    /// Node ids or hostnames; one job per node, ranked in this order.
    pub nodes: Vec<String>,
    /// Attempts before a job whose agent vanished is failed (default 3).
    #[serde(default)]
    pub max_attempts: Option<u32>,
    #[serde(default)]
    pub label: Option<String>,
    /// Apply each node's effective environment (plugin recommendations, then site and
    /// node tuning profiles, then this run's `env`) to its jobs, the way jobs will run
    /// (default true). `false` runs with this run's `env` only.
    #[serde(default)]
    pub recommended_env: Option<bool>,
}

impl RunCreate {
    /// What each job of the run executes.
    pub fn spec(&self) -> JobSpec {
        JobSpec {
            kind: self.kind.clone(),
            params: Params::new(&self.kind, self.params.clone()),
            env: self.env.clone(),
            timeout_s: self.timeout_s,
            stall_s: self.stall_s,
        }
    }
}

/// Aggregate state of a run, derived from its jobs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Run {
    pub id: Uuid,
    pub label: Option<String>,
    pub spec: JobSpec,
    pub state: RunState,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub jobs: Vec<Job>,
}

/// One variable of the environment a job's test ran with, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    /// A plugin's name (its recommendation), `tuning:<profile>` (a site or node tuning
    /// profile) or `run` (the run's own `env`).
    pub source: String,
}

/// The `source` of a variable from the run's own `env`.
pub const RUN_ENV_SOURCE: &str = "run";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Job {
    pub id: Uuid,
    pub run_id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    pub rank: i32,
    pub world_size: i32,
    pub state: JobState,
    pub attempts: i32,
    pub max_attempts: i32,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub cancel_requested: bool,
    pub error: Option<String>,
    pub progress: Option<Progress>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The environment this node's test gets, sorted by name; empty for jobs stored
    /// before it was recorded (they ran with the run's `env`).
    #[serde(default)]
    pub applied_env: Vec<EnvVar>,
}

/// How far a long job has come, reported with lease renewals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Progress {
    /// 0.0 ..= 1.0 when known.
    #[serde(default)]
    pub fraction: Option<f64>,
    pub message: String,
}

pub use crate::rows::ResultRow;

/// Final outcome an agent reports for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Succeeded,
    Failed,
    Skipped,
    Cancelled,
}

impl Outcome {
    pub fn job_state(self) -> JobState {
        match self {
            Outcome::Succeeded => JobState::Succeeded,
            Outcome::Failed => JobState::Failed,
            Outcome::Skipped => JobState::Skipped,
            Outcome::Cancelled => JobState::Cancelled,
        }
    }
}

/// A job's result as uploaded by the agent. `upload_key` makes the upload idempotent: the
/// agent generates it once, spools it with the result, and re-sends it on every retry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResultUpload {
    pub upload_key: String,
    pub outcome: Outcome,
    /// Why it failed or was skipped, with the evidence.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub stderr_tail: Option<String>,
    /// Run metadata: NCCL version, transport, channels, tool versions...
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub summary: serde_json::Value,
    #[serde(default)]
    pub rows: Vec<ResultRow>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// The claim the job ran under (`JobLease::claim_id`). A result from a claim that is no
    /// longer the job's latest is refused with 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_id: Option<Uuid>,
}

/// A stored result, as returned by the API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobResult {
    pub id: Uuid,
    pub job_id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub exit_code: Option<i32>,
    pub stderr_tail: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub summary: serde_json::Value,
    pub rows: Vec<ResultRow>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub received_at: DateTime<Utc>,
    /// Pass / warn / fail with reasons; absent until the result has been judged.
    #[serde(default)]
    pub verdict: Option<crate::health::ResultVerdict>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_state_follows_jobs() {
        use JobState::*;
        let s = |states: &[JobState]| RunState::of(states.iter().copied()).as_str();
        assert_eq!(s(&[Queued, Queued]), "queued");
        assert_eq!(s(&[Queued, Running]), "running");
        assert_eq!(s(&[Succeeded, Leased]), "running");
        assert_eq!(s(&[Succeeded, Succeeded]), "succeeded");
        assert_eq!(s(&[Succeeded, Skipped]), "succeeded");
        assert_eq!(s(&[Skipped, Skipped]), "skipped");
        assert_eq!(s(&[Succeeded, Failed, Cancelled]), "failed");
        assert_eq!(s(&[Succeeded, Cancelled]), "cancelled");
        assert_eq!(s(&[]), "succeeded");
    }

    #[test]
    fn run_state_keeps_its_wire_spelling() {
        for st in RunState::ALL {
            let json = serde_json::to_string(&st).unwrap();
            assert_eq!(json, format!("\"{}\"", st.as_str()));
            assert_eq!(serde_json::from_str::<RunState>(&json).unwrap(), st);
            assert_eq!(st.as_str().parse::<RunState>().unwrap(), st);
        }
        assert!("done".parse::<RunState>().is_err());
    }
}
