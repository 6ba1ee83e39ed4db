//! The environment behind a worse figure: when a finished test is judged WARN or FAIL, its
//! verdict quotes the environment each rank ran with (`jobs.applied_env`) and what changed
//! on this node since its last passing result of the same test. A tuning profile or a
//! plugin's recommendation that slows a pair is then visible in the verdict itself.

use heddle_types::health::{Reason, Severity};
use heddle_types::jobs::EnvVar;
use heddle_types::regress::facts_diff;
use uuid::Uuid;

/// The verdict reason's code and basis.
pub const CODE: &str = "applied-env";
/// Variables quoted per rank at most; the rest are counted.
const SHOWN_PER_RANK: usize = 12;

type EnvJson = Option<sqlx::types::Json<Vec<EnvVar>>>;

/// What a result is: its run, node (and the node's hostname), test and id.
pub struct Judged<'a> {
    pub run: Uuid,
    pub node: Uuid,
    pub hostname: &'a str,
    pub test: &'a str,
    pub result: Uuid,
}

/// The reason for a judged result, or `None` when no rank ran with anything set and
/// nothing changed since the node's last pass (there is nothing to quote).
pub async fn reason(
    db: &mut sqlx::PgConnection,
    j: Judged<'_>,
) -> Result<Option<Reason>, sqlx::Error> {
    let ranks: Vec<(String, EnvJson)> = sqlx::query!(
        r#"SELECT n.hostname, j.applied_env AS "applied_env: sqlx::types::Json<Vec<EnvVar>>"
         FROM jobs j JOIN nodes n ON n.id = j.node_id
         WHERE j.run_id = $1 ORDER BY j.rank"#,
        j.run,
    )
    .fetch_all(&mut *db)
    .await?
    .into_iter()
    .map(|r| (r.hostname, r.applied_env))
    .collect();
    if ranks.iter().all(|(_, e)| e.is_none()) {
        return Ok(None);
    }
    let before: Option<EnvJson> = sqlx::query_scalar!(
        r#"SELECT j.applied_env AS "applied_env: sqlx::types::Json<Vec<EnvVar>>"
         FROM verdicts v JOIN results r ON r.id = v.result_id
         JOIN jobs j ON j.id = r.job_id
         WHERE v.node_id = $1 AND v.test = $2 AND v.verdict = 'pass' AND v.result_id <> $3
         ORDER BY v.judged_at DESC LIMIT 1"#,
        j.node,
        j.test,
        j.result,
    )
    .fetch_optional(db)
    .await?;
    let ranks: Vec<(String, Vec<EnvVar>)> = ranks
        .into_iter()
        .map(|(h, e)| (h, e.map(|e| e.0).unwrap_or_default()))
        .collect();
    let before = before.map(|e| e.map(|e| e.0).unwrap_or_default());
    let quiet =
        ranks.iter().all(|(_, e)| e.is_empty()) && before.as_ref().is_none_or(|b| b.is_empty());
    Ok((!quiet).then(|| describe(&ranks, j.hostname, before.as_deref())))
}

/// The reason, from each rank's environment and, when known, the environment node `this`
/// had at its last passing result.
pub fn describe(ranks: &[(String, Vec<EnvVar>)], this: &str, before: Option<&[EnvVar]>) -> Reason {
    let mut parts = Vec::with_capacity(ranks.len());
    for (host, env) in ranks {
        let mut vars: Vec<String> = env
            .iter()
            .take(SHOWN_PER_RANK)
            .map(|v| format!("{}={} ({})", v.name, v.value, v.source))
            .collect();
        if env.len() > SHOWN_PER_RANK {
            vars.push(format!("and {} more", env.len() - SHOWN_PER_RANK));
        }
        let vars = if vars.is_empty() {
            "nothing set".to_string()
        } else {
            vars.join(", ")
        };
        parts.push(format!("{host}: {vars}"));
    }
    let mut message = format!("applied environment: {}", parts.join("; "));
    let now = ranks.iter().find(|(h, _)| h == this).map(|(_, e)| e);
    if let (Some(before), Some(now)) = (before, now) {
        let changed = changes(before, now);
        if changed.is_empty() {
            message.push_str(&format!(
                "; {this} had the same environment at its last passing result"
            ));
        } else {
            message.push_str(&format!(
                "; changed since {this}'s last passing result: {}",
                changed.join(", ")
            ));
        }
    }
    Reason {
        severity: Severity::Info,
        message,
        metric: None,
        observed: None,
        expected: None,
        basis: CODE.into(),
        code: Some(CODE.into()),
        evidence: None,
    }
}

/// `NAME=new (was old)`, `NAME=new (was unset)`, `NAME unset (was old)`, by name.
fn changes(before: &[EnvVar], now: &[EnvVar]) -> Vec<String> {
    let map = |env: &[EnvVar]| {
        env.iter()
            .map(|v| (v.name.clone(), v.value.clone()))
            .collect()
    };
    facts_diff::diff(&map(before), &map(now))
        .into_iter()
        .filter_map(|c| match (c.before, c.after) {
            (Some(old), Some(new)) => Some(format!("{}={new} (was {old})", c.field)),
            (None, Some(new)) => Some(format!("{}={new} (was unset)", c.field)),
            (Some(old), None) => Some(format!("{} unset (was {old})", c.field)),
            (None, None) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, value: &str, source: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.into(),
            source: source.into(),
        }
    }

    #[test]
    fn each_rank_is_quoted_and_the_change_since_the_last_pass_named() {
        let ranks = vec![
            (
                "gpu-0".to_string(),
                vec![var("NCCL_MAX_NCHANNELS", "1", "run")],
            ),
            (
                "gpu-1".to_string(),
                vec![
                    var("NCCL_MAX_NCHANNELS", "1", "run"),
                    var("NCCL_IB_HCA", "mlx5_1", "ib-hca"),
                ],
            ),
        ];
        let before = [var("NCCL_IB_HCA", "mlx5_0", "ib-hca")];
        let r = describe(&ranks, "gpu-0", Some(&before));
        assert_eq!(r.code.as_deref(), Some(CODE));
        assert_eq!(r.severity, Severity::Info);
        assert!(
            r.message.contains("gpu-0: NCCL_MAX_NCHANNELS=1 (run)")
                && r.message
                    .contains("gpu-1: NCCL_MAX_NCHANNELS=1 (run), NCCL_IB_HCA=mlx5_1"),
            "{}",
            r.message
        );
        assert!(
            r.message.contains("NCCL_MAX_NCHANNELS=1 (was unset)")
                && r.message.contains("NCCL_IB_HCA unset (was mlx5_0)"),
            "{}",
            r.message
        );
        let same = describe(&ranks[..1], "gpu-0", Some(&ranks[0].1));
        assert!(
            same.message.contains("same environment"),
            "{}",
            same.message
        );
    }

    #[test]
    fn a_long_environment_is_cut_and_counted() {
        let env: Vec<EnvVar> = (0..20).map(|i| var(&format!("V{i}"), "1", "p")).collect();
        let r = describe(&[("n".into(), env)], "n", None);
        assert!(r.message.contains("and 8 more"), "{}", r.message);
        assert!(!r.message.contains("V19"), "{}", r.message);
        let none = describe(&[("n".into(), vec![])], "n", None);
        assert!(none.message.contains("n: nothing set"), "{}", none.message);
    }
}
