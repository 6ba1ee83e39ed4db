//! Reading stored verdicts: per result (for results pages), latest per node and test (node
//! health, fleet summary and metrics read `latest_verdicts`, which outlives the month of
//! the result it is about: docs/health.md, "History"; pre-flight reads recent verdicts).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use heddle_types::health::{
    Figure, FleetHealth, NodeHealthLine, Reason, ResultVerdict, Severity, TestHealth, Verdict,
};
use sqlx::PgPool;
use uuid::Uuid;

use super::HealthError;

struct VerdictRow {
    result_id: Uuid,
    run_id: Uuid,
    node_id: Uuid,
    test: String,
    verdict: String,
    reasons: serde_json::Value,
    metric: Option<String>,
    value: Option<f64>,
    figures: serde_json::Value,
    world_size: i32,
    judged_at: DateTime<Utc>,
}

fn verdict(s: &str) -> Verdict {
    // The table's CHECK constraint admits only the four names.
    s.parse().unwrap_or(Verdict::Unknown)
}

fn reasons(v: &serde_json::Value) -> Result<Vec<Reason>, HealthError> {
    serde_json::from_value(v.clone()).map_err(|source| HealthError::Decode {
        what: "verdict reasons",
        source,
    })
}

impl VerdictRow {
    fn into_result_verdict(self) -> Result<ResultVerdict, HealthError> {
        let figures: Vec<Figure> =
            serde_json::from_value(self.figures).map_err(|source| HealthError::Decode {
                what: "verdict figures",
                source,
            })?;
        Ok(ResultVerdict {
            result_id: self.result_id,
            verdict: verdict(&self.verdict),
            test: self.test,
            metric: self.metric,
            value: self.value,
            reasons: reasons(&self.reasons)?,
            figures,
            judged_at: self.judged_at,
        })
    }

    fn into_test_health(self) -> Result<TestHealth, HealthError> {
        Ok(TestHealth {
            verdict: verdict(&self.verdict),
            reasons: reasons(&self.reasons)?,
            test: self.test,
            metric: self.metric,
            value: self.value,
            result_id: self.result_id,
            run_id: self.run_id,
            world_size: self.world_size,
            judged_at: self.judged_at,
        })
    }
}

/// Whether the result has its verdict.
pub async fn is_judged(db: &PgPool, result_id: Uuid) -> sqlx::Result<bool> {
    let found = sqlx::query_scalar!(
        "SELECT result_id FROM verdicts WHERE result_id = $1",
        result_id
    )
    .fetch_optional(db)
    .await?;
    Ok(found.is_some())
}

/// Verdicts of these results, by result id.
pub async fn for_results(
    db: &PgPool,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, ResultVerdict>, HealthError> {
    let rows = sqlx::query_as!(
        VerdictRow,
        "SELECT v.result_id, v.run_id, v.node_id, v.test, v.verdict, v.reasons, v.metric, v.value,
                v.figures, v.world_size, v.judged_at
         FROM verdicts v WHERE v.result_id = ANY($1)",
        ids,
    )
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|r| Ok((r.result_id, r.into_result_verdict()?)))
        .collect()
}

/// The latest verdict of every test on a node, newest first.
pub async fn node_tests(db: &PgPool, node_id: Uuid) -> Result<Vec<TestHealth>, HealthError> {
    let rows = sqlx::query_as!(
        VerdictRow,
        "SELECT v.result_id, v.run_id, v.node_id, v.test, v.verdict, v.reasons, v.metric, v.value,
                v.figures, v.world_size, v.judged_at
         FROM latest_verdicts v WHERE v.node_id = $1 ORDER BY v.judged_at DESC",
        node_id,
    )
    .fetch_all(db)
    .await?;
    rows.into_iter().map(VerdictRow::into_test_health).collect()
}

/// The latest verdict of one test on each of these nodes, judged after `since`.
/// `test_prefix` matches `test` exactly or as `<prefix>.` (so `p2p` finds `p2p.h2d`).
pub async fn latest_for_nodes(
    db: &PgPool,
    nodes: &[Uuid],
    test: &str,
    since: DateTime<Utc>,
) -> Result<HashMap<Uuid, TestHealth>, HealthError> {
    let rows = sqlx::query_as!(
        VerdictRow,
        "SELECT DISTINCT ON (v.node_id) v.result_id, v.run_id, v.node_id, v.test, v.verdict,
                v.reasons, v.metric, v.value, v.figures, v.world_size, v.judged_at
         FROM verdicts v
         WHERE v.node_id = ANY($1) AND (v.test = $2 OR v.test LIKE $2 || '.%') AND v.judged_at >= $3
           AND v.world_size = 1
         ORDER BY v.node_id, v.judged_at DESC",
        nodes,
        test,
        since,
    )
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|r| Ok((r.node_id, r.into_test_health()?)))
        .collect()
}

/// The latest verdict and headline figure per node and test, for /metrics: one line per
/// (node, test) pair, so the series count is bounded by nodes × tests ever run.
#[derive(Debug, Clone)]
pub struct LatestLine {
    pub hostname: String,
    pub test: String,
    pub verdict: String,
    pub metric: Option<String>,
    pub value: Option<f64>,
    /// NCCL's network for that result (`IB`, `Socket`), when its log said.
    pub nccl_network: Option<String>,
}

pub async fn latest_lines(db: &PgPool) -> Result<Vec<LatestLine>, sqlx::Error> {
    sqlx::query_as!(
        LatestLine,
        r#"SELECT n.hostname, v.test, v.verdict, v.metric, v.value,
                r.summary->>'nccl_network' AS "nccl_network?"
         FROM latest_verdicts v JOIN nodes n ON n.id = v.node_id
         LEFT JOIN results r ON r.id = v.result_id AND r.received_at = v.received_at"#,
    )
    .fetch_all(db)
    .await
}

/// Every node with the combination of its tests' latest verdicts, worst first.
/// Where a node's line sorts in the fleet view: worst verdict first, then by hostname. Also
/// the key a page of that view resumes after (`api::verdicts::fleet_health`).
pub fn fleet_key(line: &NodeHealthLine) -> (u8, String) {
    let rank = match line.verdict {
        Verdict::Fail => 0,
        Verdict::Warn => 1,
        Verdict::Unknown => 2,
        Verdict::Pass => 3,
    };
    (rank, line.hostname.clone())
}

pub async fn fleet(db: &PgPool, regression: Severity) -> Result<FleetHealth, HealthError> {
    let nodes = sqlx::query!("SELECT id, hostname, gpu_model FROM nodes ORDER BY hostname")
        .fetch_all(db)
        .await?;
    let latest: Vec<(Uuid, String, String, DateTime<Utc>)> =
        sqlx::query!("SELECT node_id, test, verdict, judged_at FROM latest_verdicts")
            .fetch_all(db)
            .await?
            .into_iter()
            .map(|l| (l.node_id, l.test, l.verdict, l.judged_at))
            .collect();
    // One pass over the verdicts, then one lookup per node (not a scan per node: a fleet
    // of 50,000 nodes has hundreds of thousands of latest verdicts).
    let mut by_node: HashMap<Uuid, Vec<&(Uuid, String, String, DateTime<Utc>)>> = HashMap::new();
    for l in &latest {
        by_node.entry(l.0).or_default().push(l);
    }
    // Observed jobs that warn or fail (`health::observed`): one line per node and verdict.
    let mut jobs: HashMap<Uuid, Verdict> = HashMap::new();
    for (node_id, _, v, _) in super::observed::recent_by_node(db).await? {
        let v = verdict(&v);
        if matches!(v, Verdict::Warn | Verdict::Fail) {
            let e = jobs.entry(node_id).or_insert(v);
            *e = Verdict::combine([*e, v]);
        }
    }
    // Open regressions (`health::regress`), at their configured severity.
    let regression = match regression {
        Severity::Fail => Some(Verdict::Fail),
        Severity::Warn => Some(Verdict::Warn),
        Severity::Info => None,
    };
    let mut regressed: HashMap<Uuid, Verdict> = HashMap::new();
    if let Some(v) = regression {
        for (node_id, ..) in super::regress::store::open_by_node(db).await? {
            regressed.insert(node_id, v);
        }
    }
    let mut lines: Vec<NodeHealthLine> = nodes
        .into_iter()
        .map(|n| {
            let (node_id, hostname, gpu_model) = (n.id, n.hostname, n.gpu_model);
            let mine = by_node.remove(&node_id).unwrap_or_default();
            let job = jobs.get(&node_id).copied();
            let regressed = regressed.get(&node_id).copied();
            let failing = mine
                .iter()
                .filter(|l| matches!(verdict(&l.2), Verdict::Warn | Verdict::Fail))
                .map(|l| l.1.clone())
                .chain(job.map(|_| "observed-jobs".to_string()))
                .chain(regressed.map(|_| heddle_types::regress::REGRESSION_CODE.to_string()))
                .collect();
            NodeHealthLine {
                node_id,
                hostname,
                gpu_model,
                verdict: Verdict::combine(
                    mine.iter()
                        .map(|l| verdict(&l.2))
                        .chain(job)
                        .chain(regressed),
                ),
                failing,
                last_judged_at: mine.iter().map(|l| l.3).max(),
            }
        })
        .collect();
    lines.sort_by_cached_key(fleet_key);
    let count = |v: Verdict| lines.iter().filter(|l| l.verdict == v).count() as i64;
    Ok(FleetHealth {
        pass: count(Verdict::Pass),
        warn: count(Verdict::Warn),
        fail: count(Verdict::Fail),
        unknown: count(Verdict::Unknown),
        nodes: lines,
    })
}
