//! `fail`: writes `message` (default "requested failure") to stderr and exits with
//! `exit_code` (default 1, 1..=255), so failure reporting can be tested end to end.

use super::protocol::ChildInput;
use super::{RunError, Sink, param_u64};

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let code = param_u64(&input.params, "exit_code")?.unwrap_or(1);
    if !(1..=255).contains(&code) {
        return Err(RunError::Params(format!(
            "exit_code must be in 1..=255, got {code}"
        )));
    }
    let message = match input.params.get("message") {
        None | Some(serde_json::Value::Null) => "requested failure".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(RunError::Params(format!(
                "message must be a string, got {other}"
            )));
        }
    };
    out.progress(None, "about to fail")?;
    Err(RunError::Failed {
        code: code as u8,
        message,
    })
}
