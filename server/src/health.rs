//! Fleet health: is a measured figure normal? Every stored result is judged against
//! expectations (built-in, plugin-provided, operator-defined), the node's own history and
//! the fleet; the verdict is stored in `verdicts` and read by the API, metrics and
//! investigations. The rules are in docs/health.md.

pub mod checks;
pub mod expectations;
pub mod figures;
pub mod observed;
pub mod preflight;
pub mod regress;
pub mod store;
pub mod transport;
pub mod verdict;

use uuid::Uuid;

/// What judging or reading health can fail with; mapped to HTTP in `http/error.rs`.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("no result {0}")]
    NoSuchResult(Uuid),
    /// A regressions series with no figures at all.
    #[error("no such series: {0}")]
    NoSuchSeries(String),
    /// A request the domain refuses (a time range that ends before it starts).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// Starting a check run failed.
    #[error(transparent)]
    Jobs(#[from] crate::jobs::JobError),
    #[error("stored {what} does not decode: {source}")]
    Decode {
        what: &'static str,
        source: serde_json::Error,
    },
}
