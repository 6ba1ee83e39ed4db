//! Test runners. Every test runs in a child process — the agent binary re-executed with
//! the hidden `child` subcommand — so a crash, a hang or a leak in a test cannot take the
//! agent down, and the job's environment (`NCCL_*`, `UCX_*`...) reaches that test only.
//!
//! A job kind is one module exposing `run(&ChildInput, &mut Emitter) -> Result<(), RunError>`
//! and one line in [`KINDS`], named as the kind's module in `heddle_types::kinds` that holds
//! its parameter type (the server checks a run's params with it and the dashboard builds
//! its form from it; the runner decodes through the same type). The parent side (spawn, timeout, kill, stderr tail) lives in
//! [`supervise`] and knows nothing about kinds.

pub mod child_env;
pub mod env;
pub mod fail;
pub mod gpu_busy;
pub mod memcpy;
pub mod nccl;
pub mod p2p;
pub mod protocol;
pub mod rdma;
pub mod rdma_ab;
pub mod sleep;
pub mod stall;
pub mod supervise;
pub mod sweep;
pub mod ucx;
pub mod ucx_parse;

use std::io::{Read, Write};
use std::process::ExitCode;

use protocol::{ChildEvent, ChildInput, Emitter};

/// Why a test did not succeed, as seen inside the child.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid params: {0}")]
    Params(String),
    /// The node lacks what the test needs; the outcome is `skipped`, not `failed`.
    #[error("{0}")]
    Skip(String),
    /// The test ran and failed; the child exits with `code`.
    #[error("{message}")]
    Failed { code: u8, message: String },
    #[error("cannot write to the agent: {0}")]
    Io(#[from] std::io::Error),
}

/// Where a kind writes its events: the child's stdout, or a buffer in tests.
pub type Sink<'a> = Emitter<&'a mut dyn Write>;

pub type RunFn = fn(&ChildInput, &mut Sink<'_>) -> Result<(), RunError>;

pub struct Kind {
    pub name: &'static str,
    pub run: RunFn,
    /// Runs on the GPUs: deferred while another process uses them ([`gpu_busy`]).
    pub gpu: bool,
}

/// The built-in job kinds.
pub const KINDS: &[Kind] = &[
    Kind {
        name: "env",
        run: env::run,
        gpu: false,
    },
    Kind {
        name: "memcpy",
        run: memcpy::run,
        gpu: false,
    },
    Kind {
        name: "nccl",
        run: nccl::run,
        gpu: true,
    },
    Kind {
        name: "p2p",
        run: p2p::run,
        gpu: true,
    },
    Kind {
        name: "sweep",
        run: sweep::run,
        gpu: true,
    },
    Kind {
        name: "rdma_ab",
        run: rdma_ab::run,
        gpu: true,
    },
    Kind {
        name: "ucx",
        run: ucx::run,
        gpu: false,
    },
    Kind {
        name: "rdma",
        run: rdma::run,
        gpu: false,
    },
    Kind {
        name: "sleep",
        run: sleep::run,
        gpu: false,
    },
    Kind {
        name: "fail",
        run: fail::run,
        gpu: false,
    },
];

pub fn find(kind: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == kind)
}

/// Arguments of the hidden `child` subcommand; the input comes on stdin.
#[derive(Debug, clap::Args)]
pub struct ChildArgs {}

/// Entry point of the child process: read the input, run the kind, exit with its status.
pub fn child_command(_args: ChildArgs) -> ExitCode {
    let mut raw = Vec::new();
    if let Err(err) = std::io::stdin().read_to_end(&mut raw) {
        eprintln!("heddle-agent child: cannot read input: {err}");
        return ExitCode::from(2);
    }
    let input: ChildInput = match serde_json::from_slice(&raw) {
        Ok(input) => input,
        Err(err) => {
            eprintln!("heddle-agent child: invalid input: {err}");
            return ExitCode::from(2);
        }
    };
    let Some(kind) = find(&input.kind) else {
        eprintln!("unsupported job kind: {}", input.kind);
        return ExitCode::from(2);
    };
    let mut stdout = std::io::stdout().lock();
    let mut emitter: Sink<'_> = Emitter::new(&mut stdout);
    let outcome = match kind.gpu.then(gpu_busy::check).flatten() {
        Some(reason) => Err(RunError::Skip(reason)),
        None => (kind.run)(&input, &mut emitter),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Skip(reason)) => {
            eprintln!("skipped: {reason}");
            match emitter.emit(&ChildEvent::Skipped { reason }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::from(2),
            }
        }
        Err(RunError::Failed { code, message }) => {
            eprintln!("{message}");
            ExitCode::from(code.max(1))
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_unique_and_found() {
        for k in KINDS {
            assert_eq!(find(k.name).map(|f| f.name), Some(k.name));
            assert_eq!(KINDS.iter().filter(|o| o.name == k.name).count(), 1);
        }
        assert!(find("nccl-allreduce-from-the-future").is_none());
    }

    #[test]
    fn every_kind_is_in_the_catalogue_and_back() {
        // The server refuses a kind the catalogue lacks, and the launcher offers only
        // what it lists: a kind added here must get its parameter type there.
        for k in KINDS {
            assert!(
                heddle_types::kinds::find_kind(k.name).is_some(),
                "kind {} has no module in heddle_types::kinds::KINDS",
                k.name
            );
        }
        for c in heddle_types::kinds::KINDS {
            assert!(
                find(c.name).is_some(),
                "catalogue kind {} has no runner",
                c.name
            );
        }
    }
}
