//! The agent's exit statuses: one table for every subcommand (docs/agent.md, "Exit
//! status"), so a service manager, a launcher or a script reads the same number the same
//! way whichever command it ran. `exec` is the exception by design: it becomes the rank's
//! command, whose status is its own.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (`run`: stopped by SIGTERM/SIGINT) |
//! | 1 | a result is wrong (`bench`: elements failed validation), or an error none of the below names |
//! | 2 | usage: bad flags or arguments |
//! | 3 | unavailable: what the command needs is not on this node (no CUDA driver, GPU or NCCL) |
//! | 4 | the test failed while it ran (CUDA or NCCL returned an error) |
//! | 5 | hung: no progress within the stall limit |
//! | 6 | refused: the server refused the agent's credential or enrollment token; retrying cannot fix it |

pub const SUCCESS: u8 = 0;
pub const WRONG: u8 = 1;
/// As clap's own usage errors.
pub const USAGE: u8 = 2;
pub const UNAVAILABLE: u8 = 3;
pub const FAILED: u8 = 4;
pub const HUNG: u8 = 5;
pub const REFUSED: u8 = 6;

/// An error that ends the command with `code`; `main` prints `message` and exits with it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl Exit {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Exit {
            code,
            message: message.into(),
        }
    }
}

/// The status `main` exits with for `err`: an [`Exit`]'s code, else 1.
pub fn code_of(err: &anyhow::Error) -> u8 {
    err.downcast_ref::<Exit>().map_or(WRONG, |e| e.code)
}
