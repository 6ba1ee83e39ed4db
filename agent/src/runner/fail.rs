//! `fail`: writes `message` (default "requested failure") to stderr and exits with
//! `exit_code` (default 1, 1..=255), so failure reporting can be tested end to end.

use super::protocol::ChildInput;
use heddle_types::kinds::fail::FailParams;
use heddle_types::params::KindParams;

use super::{RunError, Sink};

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let FailParams { exit_code, message } =
        FailParams::decode(&input.params).map_err(|e| RunError::Params(e.to_string()))?;
    out.progress(None, "about to fail")?;
    Err(RunError::Failed {
        code: exit_code as u8,
        message,
    })
}
