//! Runs (what a person starts) and their jobs (what each agent executes): the domain module
//! that owns a job's life. `state.rs` is the table of legal moves; `store.rs` is the only
//! code that changes a job row, and checks every row it moves against that table;
//! `runs.rs` creates and reads runs; `results.rs` stores a claim's result and ends its job;
//! `spec.rs` checks what a run may execute.
//!
//! Callers: the HTTP handlers in `api/` (runs, the agent protocol, agent revocation and
//! enrollment), the lease reaper (`leases.rs`), the heartbeat flush (`liveness.rs`),
//! `health/` (pre-flight checks) and `investigate/`. Nothing here knows about HTTP: errors are [`JobError`], mapped to
//! responses in `http/error.rs`.

pub mod read;
pub mod rendezvous;
pub mod results;
pub mod runs;
pub mod spec;
pub mod state;
pub mod store;

pub use runs::{MAX_RUN_NODES, NewRun, agreed_env, insert_run, load_run, resolve_run_nodes};
pub use spec::validate_spec;
pub use state::{IllegalMove, Move};

use uuid::Uuid;

/// What a change to runs and jobs can fail with; mapped to HTTP in `http/error.rs`.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("no run {0}")]
    NoRun(Uuid),
    #[error("no job {0}")]
    NoJob(Uuid),
    #[error(transparent)]
    Lookup(#[from] crate::db::LookupError),
    /// The request cannot be carried out as asked (422).
    #[error("{0}")]
    Invalid(String),
    /// The job belongs to another node than the caller's.
    #[error("job {0} belongs to another node")]
    OtherNode(Uuid),
    /// Sent under a claim that is no longer the job's latest.
    #[error("{0}")]
    StaleClaim(String),
    /// The job is not (or no longer) in a state that allows this (409).
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Illegal(#[from] IllegalMove),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("stored {what} does not decode: {message}")]
    Corrupt { what: &'static str, message: String },
    /// The nodes' environments would split a communicator (422).
    #[error(transparent)]
    EnvSplit(#[from] heddle_types::must_agree::EnvSplits),
}

/// A variable or value the environment policy refuses: the input is at fault.
impl From<heddle_types::env_policy::EnvError> for JobError {
    fn from(err: heddle_types::env_policy::EnvError) -> Self {
        JobError::Invalid(err.to_string())
    }
}
