//! What a run may execute: the checks every job spec passes before it is stored, whoever
//! starts the run (a person, a pre-flight check, an investigation).

use heddle_types::collective::canonical_collective;
use heddle_types::jobs::JobSpec;

use super::JobError;

/// Kinds whose `op` parameter names an NCCL collective.
const COLLECTIVE_KINDS: [&str; 2] = ["nccl", "sweep"];

/// Checks a job spec and puts its collective name in the one spelling that results,
/// verdicts and expectations use (`allreduce` becomes `all_reduce`).
pub fn validate_spec(spec: &mut JobSpec) -> Result<(), JobError> {
    let kind_ok = !spec.kind.is_empty()
        && spec.kind.len() <= 64
        && spec
            .kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !kind_ok {
        return Err(JobError::Invalid(format!(
            "kind {:?} must be 1-64 letters, digits, '_', '-' or '.'",
            spec.kind
        )));
    }
    if !(spec.params.is_object() || spec.params.is_null()) {
        return Err(JobError::Invalid("params must be a JSON object".into()));
    }
    if COLLECTIVE_KINDS.contains(&spec.kind.as_str())
        && let Some(op) = spec.params.get_mut("op")
    {
        let name = op
            .as_str()
            .ok_or_else(|| JobError::Invalid("params.op must be a collective's name".into()))?;
        *op = canonical_collective(name)
            .map_err(|e| JobError::Invalid(format!("params.op: {e}")))?
            .into();
    }
    heddle_types::env_policy::check_env(&spec.env)?;
    check_sweep_grid(spec)?;
    if spec.timeout_s == Some(0) {
        return Err(JobError::Invalid("timeout_s must be at least 1".into()));
    }
    Ok(())
}

/// A sweep's grid sets variables too, one cell at a time: each name and each value must
/// pass the same policy as a run's env. (Its shape is the agent's to check.)
fn check_sweep_grid(spec: &JobSpec) -> Result<(), JobError> {
    use heddle_types::env_policy::{check_name, check_value};
    if spec.kind != "sweep" {
        return Ok(());
    }
    let Some(grid) = spec.params.get("grid").and_then(|g| g.as_object()) else {
        return Ok(());
    };
    for (name, values) in grid {
        check_name(name)?;
        for v in values.as_array().into_iter().flatten() {
            if let Some(text) = v.as_str() {
                check_value(name, text)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        let spec = |kind: &str, params: serde_json::Value| JobSpec {
            kind: kind.into(),
            params,
            env: Default::default(),
            timeout_s: None,
        };
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({}))).is_ok());
        assert!(validate_spec(&mut spec("", serde_json::json!({}))).is_err());
        assert!(validate_spec(&mut spec("a b", serde_json::json!({}))).is_err());
        assert!(validate_spec(&mut spec("nccl", serde_json::json!([1]))).is_err());
        let mut bad_env = spec("nccl", serde_json::Value::Null);
        bad_env.env.insert("NOT-OK".into(), "1".into());
        assert!(validate_spec(&mut bad_env).is_err());
        let mut alias = spec("nccl", serde_json::json!({"op": "allreduce"}));
        validate_spec(&mut alias).unwrap();
        assert_eq!(alias.params["op"], "all_reduce");
        let mut sweep = spec("sweep", serde_json::json!({"op": "All-Gather"}));
        validate_spec(&mut sweep).unwrap();
        assert_eq!(sweep.params["op"], "all_gather");
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({"op": "gossip"}))).is_err());
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({"op": 3}))).is_err());
        // Other kinds keep their own `op` untouched.
        let mut ucx = spec("ucx", serde_json::json!({"op": "tag_bw"}));
        validate_spec(&mut ucx).unwrap();
        assert_eq!(ucx.params["op"], "tag_bw");
    }
}
