//! The Heddle control-plane server.
//!
//! Stateless: every replica keeps its state in Postgres, so several may share one database.
//! It reads from the top down: `app.rs` serves `router.rs`'s routes and runs `workers/`;
//! requests go through `http/` to a handler in `api/`, background loops are `workers/`, and
//! both are given the [`AppState`] of `state.rs` and call the domain modules below it, which
//! take the pool and the parts they need, then `db/` and `config.rs`.
//!
//! Layers, from the top; a module uses its own layer and those below it, never one above
//! (`scripts/module-graph.py` checks):
//!
//! - app: `app`, `testing`
//! - routes: `router`
//! - entry: `http`, `api`, `dashboard`, `k8s_admission`, `workers`
//! - state: `state`
//! - domain: `jobs`, `health`, `history`, `investigate`, `plugins`, `plugins_bundled`,
//!   `recommendations`, `runs_env`, `job_env`, `observed`, `fabric`, `leases`, `liveness`,
//!   `credentials`, `enrollment`, `nodes`, `token_uses`, `tokens`, `metrics`
//! - storage: `db`
//! - configuration: `config`

pub mod api;
pub mod app;
pub mod config;
pub mod credentials;
pub mod dashboard;
pub mod db;
pub mod enrollment;
pub mod fabric;
pub mod health;
pub mod history;
pub mod http;
pub mod investigate;
pub mod job_env;
pub mod jobs;
pub mod k8s_admission;
pub mod leases;
pub mod liveness;
pub mod metrics;
pub mod nodes;
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
pub mod tokens;
pub mod workers;

// What other crates start a server with.
pub use app::serve;
pub use config::Config;
pub use state::{AppState, connect};
