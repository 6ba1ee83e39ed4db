//! The Heddle node agent. It is the only component that touches hardware.
//!
//! Layers, from the top; a module may use its own layer and those below it, never one
//! above (`scripts/module-graph.py agent/src` checks this in the tests):
//!
//! - commands: `bench`, `check`, `exec`, `slurm`, `hostile_props`
//! - lifecycle: `lifecycle`
//! - runners: `runner`
//! - plugins: `detect`, `gpu_map`
//! - services: `client`, `spool`, `files`, `host_conf`, `exit`
//! - facts: `facts`, `prop_kit`
//!
//! Commands are one module per subcommand (`run` is `lifecycle`'s; `detect` is also the
//! plugins over the node's facts that `gpu_map` runs). Lifecycle is enrollment, heartbeats,
//! the job loop and observation; runners one module per test kind; services the server's
//! client, files on disk, host conf files and exit statuses; facts what the node is.

pub mod bench;
pub mod check;
pub mod client;
pub mod detect;
pub mod exec;
pub mod exit;
pub mod facts;
pub mod files;
pub mod gpu_map;
pub mod host_conf;
#[cfg(test)]
mod hostile_props;
pub mod lifecycle;
#[cfg(test)]
mod prop_kit;
pub mod runner;
pub mod slurm;
pub mod spool;

/// Logs go to stderr so `facts` output on stdout stays clean JSON.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("HEDDLE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
