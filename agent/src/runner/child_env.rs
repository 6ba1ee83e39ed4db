//! The environment of every process the agent starts for a test: the test child, and what
//! that child starts in turn (`ucx_perftest`, perftest's `ib_*`, sweep cells, the NCCL shim
//! re-run). Each starts from a cleared environment and gets only
//!
//! - a few of the agent's own variables ([`BASE`]): where programs and libraries are, the
//!   locale, and the agent settings a test reads — chosen by whoever installed the agent,
//!   never by a job;
//! - the tuning families of `heddle_types::env_policy` (`NCCL_*`, `UCX_*`, ...) as they stand
//!   in the parent: the operator's own defaults in the agent, the job's checked values on
//!   top of them in the test child;
//!
//! so the agent's credential, the enrollment token, an admin token or anything else in the
//! agent's environment never reaches a test, and a job cannot choose `PATH`, `LD_*` or a
//! plugin. The agent checks the job's own variables against the policy before it starts
//! anything (`lifecycle::job`).

use std::ffi::{OsStr, OsString};
use std::process::{Command, Stdio};

use heddle_types::env_policy;

/// Variables of the parent's environment that a test process gets as they are.
pub const BASE: &[&str] = &[
    "PATH",
    "LD_LIBRARY_PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    NCCL_LIBRARY_ENV,
    RDMA_SYSFS_ENV,
];

pub use crate::facts::NCCL_LIBRARY_ENV;

/// Where the kernel lists RDMA devices, for the `rdma` kind; tests point it elsewhere.
pub const RDMA_SYSFS_ENV: &str = "HEDDLE_RDMA_SYSFS";

/// `PATH` when the parent has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether a variable of the parent's environment passes to a test process.
pub fn passes(name: &str) -> bool {
    BASE.contains(&name) || env_policy::in_family(name)
}

/// What a test process gets from this process's environment.
pub fn inherited() -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k.to_str().is_some_and(passes))
        .collect();
    if !out.iter().any(|(k, _)| k == "PATH") {
        out.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    out
}

/// A command for `program` with a cleared environment plus [`inherited`], and stdin from
/// `/dev/null` (the test child's own stdin carried its input, credential included).
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear().envs(inherited()).stdin(Stdio::null());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_loaders_do_not_pass() {
        for name in [
            "HEDDLE_RENDEZVOUS_CREDENTIAL",
            "HEDDLE_ENROLL_TOKEN",
            "HEDDLE_ADMIN_TOKEN",
            "HEDDLE_TOKEN",
            "LD_PRELOAD",
            "AWS_SECRET_ACCESS_KEY",
            "BASH_ENV",
        ] {
            assert!(!passes(name), "{name}");
        }
        for name in ["PATH", "NCCL_IB_HCA", "UCX_TLS", "HEDDLE_NCCL_LIBRARY"] {
            assert!(passes(name), "{name}");
        }
    }

    #[test]
    fn a_command_starts_from_a_cleared_environment() {
        // This test process has CARGO_* and HOME-like variables; the child sees only what
        // passes.
        let out = command("/usr/bin/env").output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        for line in text.lines() {
            let name = line.split('=').next().unwrap();
            assert!(passes(name), "{line}");
        }
        assert!(text.lines().any(|l| l.starts_with("PATH=")), "{text}");
    }
}
