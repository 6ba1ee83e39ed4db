//! The environment a run's tests get on each node: the node's effective environment
//! (`recommendations::effective`, what `heddle env NODE` exports), with the run's own `env`
//! on top, each variable with its source. Heddle's own tests then run the way jobs will.
//!
//! The rule is applied here only: [`layer`] fixes each job's environment when the run is
//! created (stored as the job's `applied_env`), and [`job_spec`] hands it out in the spec a
//! claim returns.

use std::collections::BTreeMap;

use heddle_types::jobs::{EnvVar, JobSpec, RUN_ENV_SOURCE};
use heddle_types::nodes::Recommendation;
use uuid::Uuid;

/// The node's environment under the run's own, sorted by name. A recommended variable
/// that the env policy (`env_policy::check_var`) refuses is left out and logged: a bad
/// recommendation must not stop every run on the node.
pub fn layer(node: &[Recommendation], run: &BTreeMap<String, String>) -> Vec<EnvVar> {
    let mut out: BTreeMap<String, EnvVar> = BTreeMap::new();
    for r in node {
        if let Err(e) = heddle_types::env_policy::check_var(&r.name, &r.value) {
            tracing::warn!(name = %r.name, source = %r.source, error = %e, "recommended variable left out of a run");
            continue;
        }
        out.insert(
            r.name.clone(),
            EnvVar {
                name: r.name.clone(),
                value: r.value.clone(),
                source: r.source.clone(),
            },
        );
    }
    for (name, value) in run {
        out.insert(
            name.clone(),
            EnvVar {
                name: name.clone(),
                value: value.clone(),
                source: RUN_ENV_SOURCE.into(),
            },
        );
    }
    out.into_values().collect()
}

/// The spec a job of the run is handed: the run's, with the job's applied environment (what
/// [`layer`] gave it when the run was created) in place of the run's own `env`. A job stored
/// without one runs the run's spec as it is.
pub fn job_spec(mut run: JobSpec, applied: Option<Vec<EnvVar>>) -> JobSpec {
    if let Some(env) = applied {
        run.env = env.into_iter().map(|v| (v.name, v.value)).collect();
    }
    run
}

/// Refuses an environment too large for one test (`env_policy::MAX_ENV_VARS`,
/// `MAX_ENV_BYTES`), naming how many variables each source contributed, so that enough
/// variables across a run, profiles and recommendations cannot make every test on a node
/// fail to start (E2BIG). The agent checks again before it starts the child.
pub fn check_size(env: &[EnvVar]) -> Result<(), heddle_types::env_policy::EnvError> {
    let mut by_source: BTreeMap<&str, usize> = BTreeMap::new();
    for v in env {
        *by_source.entry(v.source.as_str()).or_default() += 1;
    }
    let sources = by_source
        .iter()
        .map(|(s, n)| format!("{s}: {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    heddle_types::env_policy::check_env_size(
        env.iter().map(|v| (v.name.as_str(), v.value.as_str())),
        &sources,
    )
}

/// What a job of the run gets on `node`; `recommended` false keeps the run's env only.
pub async fn applied(
    conn: &mut sqlx::PgConnection,
    node: Uuid,
    run: &BTreeMap<String, String>,
    recommended: bool,
) -> Result<Vec<EnvVar>, sqlx::Error> {
    let node_env = if recommended {
        crate::recommendations::effective(conn, node).await?
    } else {
        Vec::new()
    };
    Ok(layer(&node_env, run))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, value: &str, source: &str) -> Recommendation {
        Recommendation {
            name: name.into(),
            value: value.into(),
            reason: String::new(),
            source: source.into(),
        }
    }

    #[test]
    fn a_job_gets_its_applied_environment_in_place_of_the_runs() {
        let run = JobSpec {
            env: BTreeMap::from([("NCCL_ALGO".to_string(), "Ring".to_string())]),
            timeout_s: Some(60),
            ..JobSpec::new("nccl", serde_json::json!({"op": "all_reduce"}))
        };
        let applied = layer(&[rec("NCCL_IB_HCA", "mlx5_0", "tuning:site-a")], &run.env);
        let spec = job_spec(run.clone(), Some(applied));
        assert_eq!(
            spec.env,
            BTreeMap::from([
                ("NCCL_ALGO".to_string(), "Ring".to_string()),
                ("NCCL_IB_HCA".to_string(), "mlx5_0".to_string()),
            ])
        );
        assert_eq!((spec.kind.as_str(), spec.timeout_s), ("nccl", Some(60)));
        assert_eq!(spec.params, run.params);
        // Kept empty: the job gets no variable, not the run's.
        assert!(job_spec(run.clone(), Some(Vec::new())).env.is_empty());
        // Stored without one: the run's spec as it is.
        assert_eq!(job_spec(run.clone(), None), run);
    }

    #[test]
    fn oversized_environments_name_their_sources() {
        let node: Vec<_> = (0..300)
            .map(|i| rec(&format!("NCCL_X{i}"), "1", "tuning:huge"))
            .collect();
        let run = BTreeMap::from([("NCCL_ALGO".to_string(), "Ring".to_string())]);
        let e = check_size(&layer(&node, &run)).unwrap_err().to_string();
        assert!(
            e.contains("tuning:huge: 300") && e.contains("run: 1"),
            "{e}"
        );
        assert!(check_size(&layer(&node[..10], &run)).is_ok());
    }

    #[test]
    fn the_run_env_wins_and_sources_are_kept() {
        let node = [
            rec("NCCL_IB_HCA", "mlx5_0", "plugin:runai-roce@0.2.0"),
            rec("NCCL_IB_GID_INDEX", "3", "tuning:site-a"),
            rec("NOT-A-NAME", "x", "plugin:bad@1"),
        ];
        let run = BTreeMap::from([("NCCL_IB_HCA".to_string(), "mlx5_1".to_string())]);
        let env = layer(&node, &run);
        let got: Vec<(&str, &str, &str)> = env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_str(), e.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("NCCL_IB_GID_INDEX", "3", "tuning:site-a"),
                ("NCCL_IB_HCA", "mlx5_1", "run"),
            ]
        );
        assert_eq!(layer(&[], &run).len(), 1);
    }
}
