//! "Which node is bad?": investigations run a two-node test on every pair of a set of nodes,
//! build the node×node matrix of the headline figure and name the culprit; the same
//! analysis reads the GPU×GPU matrix of a `p2p` result.
//!
//! Everything is in Postgres (`investigations`, `investigation_pairs`): creating one stores
//! its pairs with their batch and starts the first batch; every replica runs the
//! investigations worker (`workers/investigations.rs`), which locks one running
//! investigation at a time with `FOR UPDATE SKIP LOCKED`, records the figures of finished
//! pair runs and starts the next batch, so a batch is started by exactly one replica. The
//! same worker starts investigations for multi-node nccl and rdma
//! runs whose results got a warn or fail verdict.
//!
//! Fabric investigations (`fabric.rs`) find the broken NIC, cable, leaf, uplink or spine
//! behind many suspects along the site's fabric, round by round, with the planner of
//! `heddle_types::fabric::plan`; the same worker advances them.

pub mod culprit;
pub mod fabric;
pub mod p2p;
pub mod schedule;

mod advance;
mod fabric_health;
mod fabric_store;
mod store;

pub use advance::{PAIR_CLAIM_DEADLINE, advance_all, create, trigger_from_verdicts};
pub use store::{list, load};

use uuid::Uuid;

/// Most nodes one investigation may pair up (2,016 pairs).
pub const MAX_NODES: usize = 64;

/// Thresholds people may ask for.
pub const THRESHOLDS: std::ops::RangeInclusive<f64> = 0.05..=0.95;

/// Who starts automatic investigations, in `created_by` and the audit log.
pub const AUTO_ACTOR: &str = "heddle:investigate";

impl From<crate::db::LookupError> for InvestigateError {
    fn from(err: crate::db::LookupError) -> Self {
        use crate::db::LookupError as E;
        match err {
            E::NoNode(key) => InvestigateError::NoSuchNode(key),
            E::NoSite(name) => InvestigateError::Invalid(format!("no site named {name:?}")),
            E::Db(e) => InvestigateError::Database(e),
        }
    }
}

impl From<crate::jobs::JobError> for InvestigateError {
    fn from(err: crate::jobs::JobError) -> Self {
        use crate::jobs::JobError as E;
        match err {
            E::Lookup(e) => e.into(),
            E::Invalid(message) => InvestigateError::Invalid(message),
            E::EnvSplit(splits) => InvestigateError::Invalid(splits.to_string()),
            E::Database(e) => InvestigateError::Database(e),
            other => InvestigateError::Corrupt {
                what: "job",
                message: other.to_string(),
            },
        }
    }
}

/// What creating or reading investigations can fail with; mapped to HTTP in `http/error.rs`.
#[derive(Debug, thiserror::Error)]
pub enum InvestigateError {
    #[error("no investigation {0}")]
    NoSuchInvestigation(Uuid),
    #[error("no result {0}")]
    NoSuchResult(Uuid),
    #[error("no node with id or hostname {0:?}")]
    NoSuchNode(String),
    /// The request cannot be carried out as asked (422).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("stored {what} does not decode: {message}")]
    Corrupt { what: &'static str, message: String },
}
