//! `heddle-agent check nccl-log FILE`: NCCL's INFO log judged against this node's facts,
//! with the same parser the `nccl` runner uses and the same rules the server's verdicts
//! use (`heddle_types::transport`), as JSON for scripts. Exit 0 when no finding is FAIL,
//! 1 otherwise; errors (unreadable file, bad root) exit 2.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use heddle_types::facts::NodeFacts;
use heddle_types::transport::{NcclReport, classify_nccl};

use crate::facts::{CollectOptions, collect};
use crate::runner::nccl::evidence;

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(subcommand)]
    pub what: CheckWhat,
}

#[derive(Debug, clap::Subcommand)]
pub enum CheckWhat {
    /// Which network and transports an NCCL run used (from its `NCCL_DEBUG=INFO` log), and
    /// whether that was the fast path this node's HCAs allow.
    NcclLog {
        /// The log (`NCCL_DEBUG_FILE`, or stderr of a run with `NCCL_DEBUG=INFO`).
        file: PathBuf,
        /// Filesystem root to read facts from (a fixture tree); the live machine without it.
        #[arg(long, env = "HEDDLE_FACTS_ROOT")]
        root: Option<PathBuf>,
        /// Indent the JSON for humans.
        #[arg(long)]
        pretty: bool,
    },
}

/// The report on one log against the given facts.
pub fn nccl_log_report(log: &str, facts: &NodeFacts) -> NcclReport {
    let ev = evidence::parse(log);
    let findings = classify_nccl(Some(&ev), Some(facts));
    NcclReport::new(&ev, findings)
}

pub fn command(args: CheckArgs) -> anyhow::Result<ExitCode> {
    match args.what {
        CheckWhat::NcclLog { file, root, pretty } => {
            let root = root.unwrap_or_else(|| PathBuf::from("/"));
            if !root.is_dir() {
                anyhow::bail!("--root {} is not a directory", root.display());
            }
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let facts = collect(&CollectOptions::for_root(&root));
            let report = nccl_log_report(&String::from_utf8_lossy(&bytes), &facts);
            let text = if pretty {
                serde_json::to_string_pretty(&report)
            } else {
                serde_json::to_string(&report)
            }?;
            println!("{text}");
            Ok(if report.failed() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}
