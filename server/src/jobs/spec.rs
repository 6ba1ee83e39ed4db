//! What a run may execute: the checks every job spec passes before it is stored, whoever
//! starts the run (a person, a pre-flight check, an investigation).

use heddle_types::jobs::JobSpec;

use super::JobError;

/// Checks a job spec: the kind is one the agents run and its params decode through the
/// kind's type in `heddle_types::kinds` (the error names the parameter at fault); the
/// collective name is put in the one spelling that results, verdicts and expectations use
/// (`allreduce` becomes `all_reduce`). A sweep grid's variables pass the env policy there.
pub fn validate_spec(spec: &mut JobSpec) -> Result<(), JobError> {
    let rule = heddle_types::names::KIND;
    if !rule.allows(&spec.kind) {
        return Err(JobError::Invalid(format!(
            "kind {:?} must be {}",
            spec.kind,
            rule.describe()
        )));
    }
    spec.params = heddle_types::kinds::check_params(&spec.kind, &spec.params)
        .map_err(|e| JobError::Invalid(e.to_string()))?;
    crate::db::check_env(&spec.env, "the run's env")?;
    if spec.timeout_s == Some(0) {
        return Err(JobError::Invalid("timeout_s must be at least 1".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked() {
        let spec = JobSpec::new;
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
        let mut sweep = spec(
            "sweep",
            serde_json::json!({"op": "All-Gather", "grid": {"NCCL_ALGO": ["Ring"]}}),
        );
        validate_spec(&mut sweep).unwrap();
        assert_eq!(sweep.params["op"], "all_gather");
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({"op": "gossip"}))).is_err());
        assert!(validate_spec(&mut spec("nccl", serde_json::json!({"op": 3}))).is_err());
        // Each kind takes only its own params, and only kinds the agents run.
        let err = validate_spec(&mut spec("ucx", serde_json::json!({"op": "tag_bw"}))).unwrap_err();
        assert!(err.to_string().contains("params.op"), "{err}");
        let err = validate_spec(&mut spec("warp-drive", serde_json::json!({}))).unwrap_err();
        assert!(err.to_string().contains("nccl"), "{err}");
        let err =
            validate_spec(&mut spec("nccl", serde_json::json!({"iters": "many"}))).unwrap_err();
        assert!(err.to_string().contains("params.iters"), "{err}");
        // A sweep grid's variables pass the env policy.
        let bad_grid = serde_json::json!({"grid": {"LD_PRELOAD": ["/tmp/x.so"]}});
        assert!(validate_spec(&mut spec("sweep", bad_grid)).is_err());
    }
}
