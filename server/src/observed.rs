//! Observed jobs: what agents read from NCCL's profiler plugin (Heddle's, or NCCL
//! Inspector) about the jobs that ran on their nodes. `store.rs` keeps the latest `seq` per
//! node, process and communicator and the node's most recently seen jobs, `ranks.rs` a
//! job's ranks across nodes; the verdict on
//! each job is `health::observed`. Never sees HTTP: its errors are [`ObservedError`].

pub mod ranks;
pub mod store;

use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum ObservedError {
    /// The upload is not one the server can store (its checks are the spool file's own,
    /// plus what Postgres can hold).
    #[error("{0}")]
    Invalid(String),
    #[error("no observed job {0}")]
    NoSuchJob(Uuid),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("stored {what} does not decode: {source}")]
    Decode {
        what: &'static str,
        source: serde_json::Error,
    },
}
