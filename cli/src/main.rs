//! `heddle`: a thin client of the Heddle API for people and scripts. Human tables by
//! default, `--json` for scripts; exit code 1 on any error, with the server's message.

mod agents;
mod args;
mod client;
mod commands;
mod config;
mod explain;
mod health;
mod investigate;
mod output;
mod rdma_ab;
mod sweeps;
mod table;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "heddle",
    version,
    about = "Command-line client of the Heddle control plane"
)]
pub struct Cli {
    /// Server URL (default: the one saved by `heddle login`).
    #[arg(long, env = "HEDDLE_URL", global = true)]
    pub server: Option<String>,
    /// API token (default: the one saved by `heddle login`).
    #[arg(long, env = "HEDDLE_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Trust for an `https://` server: `--ca-file`, `--pin-sha256` (default: those saved
    /// by `heddle login`).
    #[command(flatten)]
    pub tls: heddle_tls::ClientTls,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: commands::Command,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match commands::run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("heddle: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
