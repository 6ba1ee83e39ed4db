//! `heddle`: a thin client of the Heddle API for people and scripts. Human tables by
//! default, `--json` for scripts; the exit code says what was found or what went wrong
//! (`exit.rs`), with the server's message on stderr.

mod agents;
mod args;
mod client;
mod commands;
mod config;
mod exit;
mod explain;
mod fabric;
mod fabric_investigate;
mod files;
mod health;
mod investigate;
mod output;
mod plugins;
mod progress;
mod rdma_ab;
mod regressions;
mod runs;
mod simulate;
mod slurm;
mod sweeps;
mod table;
mod tokens;
mod workloads;

use std::process::ExitCode;

use clap::Parser;

use crate::exit::Exit;

#[derive(Parser)]
#[command(
    name = "heddle",
    version,
    about = "Command-line client of the Heddle control plane",
    after_help = exit::HELP
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
    /// Print JSON instead of tables, and no progress on stderr.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: commands::Command,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // `--help` and `--version` come this way too, to stdout.
            let _ = err.print();
            return if err.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Success.into()
            };
        }
    };
    match commands::run(cli).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("heddle: {err:#}");
            Exit::of_error(&err).into()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
