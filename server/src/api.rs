//! HTTP handlers, one module per resource. Routes are listed in `router.rs`.

pub mod agent;
pub mod decommission;
pub mod enroll;
pub mod expectations;
pub mod fabric;
pub mod investigations;
pub mod node_list;
pub mod nodes;
pub mod observed;
pub mod page;
pub mod plugins;
pub mod probes;
pub mod regressions;
pub mod rendezvous;
pub mod run_kinds;
pub mod runs;
pub mod sweeps;
pub mod tokens;
pub mod verdicts;

/// `?limit=` with a default and a ceiling, so no list request can ask for everything.
pub fn limit(requested: Option<i64>, default: i64) -> i64 {
    requested.unwrap_or(default).clamp(1, 1000)
}
