//! The Heddle node agent. It is the only component that touches hardware.

pub mod bench;
pub mod check;
pub mod client;
pub mod detect;
pub mod exec;
pub mod exit;
pub mod facts;
pub mod gpu_map;
pub mod host_conf;
#[cfg(test)]
mod hostile_props;
pub mod lifecycle;
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
