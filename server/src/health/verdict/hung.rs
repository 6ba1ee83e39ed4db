//! A test the agent stopped as hung (`summary.hung`, written by the agent's stall watch):
//! its verdict fails with the code `hung`, says where it stopped, and names the
//! must-agree variables (`heddle_types::must_agree`) on which the run's ranks differed,
//! since that is the usual cause of a silent hang. A hang is never read as a plain
//! failure or timeout.

use heddle_types::health::{Reason, Severity, Verdict};
use heddle_types::jobs::EnvVar;
use heddle_types::must_agree::{self, EnvSplits, Split};
use uuid::Uuid;

/// The verdict reason's code.
pub const CODE: &str = "hung";

/// Where the test stopped, when the agent judged it hung.
pub fn stage(summary: &serde_json::Value) -> Option<&str> {
    summary.get("hung")?.get("stage")?.as_str()
}

/// The must-agree variables on which the ranks of run `run` were given different values.
pub async fn rank_splits(
    db: &mut sqlx::PgConnection,
    run: Uuid,
) -> Result<Vec<Split>, sqlx::Error> {
    let jobs = sqlx::query!(
        r#"SELECT n.hostname, j.applied_env AS "applied_env: sqlx::types::Json<Vec<EnvVar>>"
         FROM jobs j JOIN nodes n ON n.id = j.node_id
         WHERE j.run_id = $1 ORDER BY j.rank"#,
        run,
    )
    .fetch_all(db)
    .await?;
    let envs: Vec<(String, Vec<EnvVar>)> = jobs
        .into_iter()
        .map(|j| (j.hostname, j.applied_env.map(|e| e.0).unwrap_or_default()))
        .collect();
    Ok(must_agree::splits(
        envs.iter().map(|(h, e)| (h.as_str(), e.as_slice())),
    ))
}

/// The verdict of a hung result: fail, with the outcome's reason replaced by one coded
/// `hung` that says where it stopped and what the ranks disagreed on.
pub fn apply(
    mut reasons: Vec<Reason>,
    stage: &str,
    failure: Option<&str>,
    splits: Vec<Split>,
) -> (Verdict, Vec<Reason>) {
    reasons.retain(|r| r.basis != "outcome");
    let evidence = if splits.is_empty() {
        "the ranks agreed on every must-agree variable; look at the fabric, the GPUs or a \
         peer that never started"
            .to_string()
    } else {
        EnvSplits(splits).to_string()
    };
    let why = failure.map(|f| format!(" ({f})")).unwrap_or_default();
    reasons.insert(
        0,
        Reason {
            severity: Severity::Fail,
            message: format!("the test hung at {stage}{why}"),
            metric: None,
            observed: None,
            expected: None,
            basis: "outcome".into(),
            code: Some(CODE.into()),
            evidence: Some(evidence),
        },
    );
    (Verdict::Fail, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hang_fails_with_its_stage_and_the_ranks_difference() {
        let summary = serde_json::json!({"hung": {"stage": "size 4096 B", "silent_s": 61}});
        assert_eq!(stage(&summary), Some("size 4096 B"));
        assert_eq!(stage(&serde_json::json!({"kind": "nccl"})), None);
        let set = [EnvVar {
            name: "NCCL_MAX_NCHANNELS".into(),
            value: "1".into(),
            source: "tuning:b".into(),
        }];
        let splits = must_agree::splits([("a", &[][..]), ("b", &set[..])]);
        let failed = Reason {
            severity: Severity::Fail,
            message: "the test failed: hung".into(),
            metric: None,
            observed: None,
            expected: None,
            basis: "outcome".into(),
            code: None,
            evidence: None,
        };
        let (verdict, reasons) = apply(vec![failed], "size 4096 B", Some("hung: ..."), splits);
        assert_eq!(verdict, Verdict::Fail);
        assert_eq!(reasons.len(), 1, "the plain failure is replaced");
        assert_eq!(reasons[0].code.as_deref(), Some(CODE));
        assert!(reasons[0].message.contains("size 4096 B"));
        let ev = reasons[0].evidence.as_deref().unwrap();
        assert!(
            ev.contains("NCCL_MAX_NCHANNELS") && ev.contains("tuning:b"),
            "{ev}"
        );
        let (_, agreed) = apply(vec![], "init", None, vec![]);
        assert!(agreed[0].evidence.as_deref().unwrap().contains("agreed"));
    }
}
