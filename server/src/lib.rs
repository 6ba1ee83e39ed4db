//! The Heddle control-plane server.
//!
//! Stateless: every replica keeps its state in Postgres, so several may share one database.
//! `router.rs` lists every route; handlers live in `api/`, SQL next to the types it returns.

pub mod api;
pub mod app;
pub mod config;
pub mod credentials;
pub mod dashboard;
pub mod db;
pub mod health;
pub mod http;
pub mod investigate;
pub mod job_env;
pub mod jobs;
pub mod k8s_admission;
pub mod leases;
pub mod liveness;
pub mod metrics;
pub mod observed;
pub mod plugins;
pub mod plugins_bundled;
pub mod recommendations;
pub mod router;
pub mod runs_env;
pub mod state;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod token_uses;
pub mod workers;

pub use app::serve;
pub use config::Config;
pub use state::{AppState, connect};
