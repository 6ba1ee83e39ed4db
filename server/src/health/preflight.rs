//! Pre-flight: a verdict for a set of nodes in seconds, for a job launcher. Nodes with a
//! fresh enough verdict answer from history; the others get a quick single-node check run
//! (one run per node, so one bad node cannot fail its neighbours' checks), which is waited
//! for up to `wait_s`. Checks still running at the deadline are left to finish: their
//! verdicts answer the next pre-flight.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use heddle_types::health::{
    PreflightCheck, PreflightNode, PreflightResponse, Reason, Severity, TestHealth, Verdict,
};
use heddle_types::jobs::JobSpec;
use sqlx::PgPool;
use uuid::Uuid;

use super::{HealthError, store, verdict};

pub const DEFAULT_MAX_AGE_S: u32 = 3600;
pub const DEFAULT_WAIT_S: u32 = 120;
pub const MAX_WAIT_S: u32 = 600;
/// Label of the runs pre-flight starts; a pre-flight reuses one still queued or running.
pub const RUN_LABEL: &str = "preflight";

/// The test whose verdicts answer a check, and the quick run that produces one.
pub fn check_test(check: PreflightCheck) -> &'static str {
    match check {
        PreflightCheck::Nccl => "nccl.all_reduce",
        PreflightCheck::Memcpy => "memcpy",
        PreflightCheck::Rdma => "rdma.ib_write_bw",
        PreflightCheck::P2p => "p2p",
    }
}

pub fn check_spec(check: PreflightCheck) -> JobSpec {
    let params = match check {
        // One size, large enough for the built-in NCCL floors (1 GiB), over every GPU.
        PreflightCheck::Nccl => {
            serde_json::json!({"op": "all_reduce", "min_bytes": 1u64 << 30, "max_bytes": 1u64 << 30, "warmup": 5, "iters": 20})
        }
        PreflightCheck::Memcpy => {
            serde_json::json!({"min_bytes": 1u64 << 20, "max_bytes": 64u64 << 20})
        }
        PreflightCheck::Rdma => serde_json::json!({"test": "ib_write_bw"}),
        PreflightCheck::P2p => serde_json::json!({}),
    };
    JobSpec {
        timeout_s: Some(300),
        ..JobSpec::new(check.as_str(), params)
    }
}

/// A node asked about: what the caller called it, and what it is.
#[derive(Debug, Clone)]
pub struct Asked {
    pub key: String,
    pub node_id: Uuid,
}

pub struct Request {
    pub nodes: Vec<Asked>,
    pub check: PreflightCheck,
    pub max_age: Duration,
    pub wait: Duration,
    /// Who asks, for the audit log; `None` when the caller may not start runs.
    pub operator: Option<String>,
}

fn from_history(key: &str, t: TestHealth, from: &str) -> PreflightNode {
    PreflightNode {
        node: key.to_string(),
        verdict: t.verdict,
        reasons: t.reasons,
        from: from.into(),
        result_id: Some(t.result_id),
        run_id: Some(t.run_id),
        judged_at: Some(t.judged_at),
    }
}

fn undecided(key: &str, from: &str, run_id: Option<Uuid>, message: String) -> PreflightNode {
    PreflightNode {
        node: key.to_string(),
        verdict: Verdict::Unknown,
        reasons: vec![Reason {
            severity: Severity::Info,
            message,
            metric: None,
            observed: None,
            expected: None,
            basis: "none".into(),
            code: None,
            evidence: None,
        }],
        from: from.into(),
        result_id: None,
        run_id,
        judged_at: None,
    }
}

/// Starts (or finds) a check job for every stale node; returns node → (run, job).
async fn schedule(
    db: &PgPool,
    check: PreflightCheck,
    stale: &[Uuid],
    actor: &str,
) -> Result<HashMap<Uuid, (Uuid, Uuid)>, HealthError> {
    let spec = check_spec(check);
    let mut tx = db.begin().await?;
    // Serialises concurrent pre-flights (every replica, every launcher) so that a node gets
    // one check run, not one per caller.
    sqlx::query_scalar!(r#"SELECT pg_advisory_xact_lock(727275)::text AS "locked?""#)
        .fetch_one(&mut *tx)
        .await?;
    let running = sqlx::query!(
        "SELECT j.node_id, j.run_id, j.id FROM jobs j JOIN runs r ON r.id = j.run_id
         WHERE j.node_id = ANY($1) AND r.label = $2 AND r.spec->>'kind' = $3 AND j.world_size = 1
           AND j.state IN ('queued', 'leased', 'running') AND NOT j.cancel_requested",
        stale,
        RUN_LABEL,
        check.as_str(),
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut jobs: HashMap<Uuid, (Uuid, Uuid)> = running
        .into_iter()
        .map(|r| (r.node_id, (r.run_id, r.id)))
        .collect();
    for node in stale {
        if jobs.contains_key(node) {
            continue;
        }
        let run_id = crate::jobs::insert_run(
            &mut tx,
            &crate::jobs::NewRun {
                spec: &spec,
                nodes: &[*node],
                max_attempts: 1,
                label: Some(RUN_LABEL),
                actor,
                recommended_env: true,
                audit: serde_json::json!({"nodes": [node], "by": "preflight"}),
            },
        )
        .await?;
        let job_id = sqlx::query_scalar!("SELECT id FROM jobs WHERE run_id = $1", run_id)
            .fetch_one(&mut *tx)
            .await?;
        jobs.insert(*node, (run_id, job_id));
    }
    tx.commit().await?;
    Ok(jobs)
}

/// Waits until every job has a verdict or has ended without a result, or the deadline.
async fn wait_for(
    db: &PgPool,
    jobs: &HashMap<Uuid, (Uuid, Uuid)>,
    wait: Duration,
) -> Result<HashMap<Uuid, Waited>, HealthError> {
    let deadline = tokio::time::Instant::now() + wait;
    let job_ids: Vec<Uuid> = jobs.values().map(|(_, j)| *j).collect();
    let mut done: HashMap<Uuid, Waited> = HashMap::new();
    loop {
        let states = sqlx::query!(
            r#"SELECT j.id, j.state, j.error, r.id AS "result?"
             FROM jobs j LEFT JOIN results r ON r.job_id = j.id WHERE j.id = ANY($1)"#,
            &job_ids,
        )
        .fetch_all(db)
        .await?;
        for (job, state, error, result) in states
            .into_iter()
            .map(|s| (s.id, s.state, s.error, s.result))
        {
            if done.contains_key(&job) {
                continue;
            }
            match result {
                // The upload judges its result; judging again here is harmless and covers
                // an upload whose judgement failed.
                Some(result_id) => {
                    let v = match store::for_results(db, &[result_id])
                        .await?
                        .remove(&result_id)
                    {
                        Some(v) => v,
                        None => verdict::judge_result(db, result_id).await?,
                    };
                    done.insert(job, Waited::Judged(v));
                }
                None if matches!(
                    state.as_str(),
                    "failed" | "cancelled" | "skipped" | "succeeded"
                ) =>
                {
                    done.insert(job, Waited::Ended(state, error));
                }
                None => {}
            }
        }
        if done.len() == job_ids.len() || tokio::time::Instant::now() >= deadline {
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

enum Waited {
    Judged(heddle_types::health::ResultVerdict),
    Ended(String, Option<String>),
}

pub async fn preflight(db: &PgPool, req: Request) -> Result<PreflightResponse, HealthError> {
    let test = check_test(req.check);
    let since =
        Utc::now() - chrono::Duration::from_std(req.max_age).unwrap_or(chrono::Duration::days(365));
    let ids: Vec<Uuid> = req.nodes.iter().map(|a| a.node_id).collect();
    let mut history = store::latest_for_nodes(db, &ids, test, since).await?;
    let stale: Vec<Uuid> = ids
        .iter()
        .filter(|id| !history.contains_key(id))
        .copied()
        .collect();
    let mut fresh = HashMap::new();
    let mut waited = HashMap::new();
    if !stale.is_empty()
        && !req.wait.is_zero()
        && let Some(actor) = &req.operator
    {
        fresh = schedule(db, req.check, &stale, actor).await?;
        waited = wait_for(db, &fresh, req.wait).await?;
    }
    let max_age_s = req.max_age.as_secs();
    let nodes: Vec<PreflightNode> = req
        .nodes
        .iter()
        .map(|a| {
            if let Some(t) = history.remove(&a.node_id) {
                return from_history(&a.key, t, "history");
            }
            let Some((run_id, job_id)) = fresh.get(&a.node_id).copied() else {
                let why = if req.wait.is_zero() {
                    "wait_s is 0".to_string()
                } else {
                    "starting a check needs an operator token".to_string()
                };
                return undecided(
                    &a.key,
                    "none",
                    None,
                    format!(
                        "no verdict of {test} within {max_age_s} s, and no check was started: {why}"
                    ),
                );
            };
            match waited.remove(&job_id) {
                Some(Waited::Judged(v)) => PreflightNode {
                    node: a.key.clone(),
                    verdict: v.verdict,
                    reasons: v.reasons,
                    from: "fresh-run".into(),
                    result_id: Some(v.result_id),
                    run_id: Some(run_id),
                    judged_at: Some(v.judged_at),
                },
                Some(Waited::Ended(state, error)) => {
                    let mut n = undecided(
                        &a.key,
                        "fresh-run",
                        Some(run_id),
                        format!(
                            "the check run ended {state} without a result{}",
                            error.map(|e| format!(": {e}")).unwrap_or_default()
                        ),
                    );
                    if state == "failed" {
                        n.verdict = Verdict::Fail;
                        n.reasons[0].severity = Severity::Fail;
                        n.reasons[0].basis = "outcome".into();
                    }
                    n
                }
                None => undecided(
                    &a.key,
                    "fresh-run",
                    Some(run_id),
                    format!(
                        "the check run {run_id} did not finish within {} s; it keeps running",
                        req.wait.as_secs()
                    ),
                ),
            }
        })
        .collect();
    Ok(PreflightResponse {
        verdict: Verdict::combine(nodes.iter().map(|n| n.verdict)),
        check: req.check,
        nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_has_a_test_and_a_valid_spec() {
        for check in [
            PreflightCheck::Nccl,
            PreflightCheck::Memcpy,
            PreflightCheck::Rdma,
            PreflightCheck::P2p,
        ] {
            let mut spec = check_spec(check);
            assert!(crate::jobs::validate_spec(&mut spec).is_ok());
            let kind_test = super::super::figures::extract(&spec.kind, &spec.params, &[]).test;
            assert!(
                kind_test.starts_with(check_test(check)),
                "{kind_test} answers {}",
                check_test(check)
            );
        }
    }
}
