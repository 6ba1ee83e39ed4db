//! Verdicts on observed jobs (`observed/`): did real work run as well as the node's own
//! tests say it can? Judged right after each upload that changed the job, so a job that
//! fell to sockets on an IB node fails on its node as soon as its agent's next upload is
//! stored (every 5 s by default). Rules and thresholds: docs/health.md.
//!
//! - `job-socket-fallback` (fail): a communicator spanning nodes moved most of its
//!   inter-node bytes over NCCL's socket transport while the node's facts show an ACTIVE
//!   RDMA (InfiniBand or RoCE) port.
//! - `job-below-expected` (warn): a collective's large-message (≥ 64 MiB band) bus
//!   bandwidth is below the node's own latest passing test figure for that collective and
//!   node count by more than `HEDDLE_JOB_BELOW_EXPECTED_FRACTION`.
//! - `job-env-missing` (warn): a process of the job ran without Heddle's environment
//!   plugin on a node that has recommendations.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use heddle_types::health::{Reason, Severity, Verdict};
use heddle_types::observed::{LARGE_BAND, ObservedComm, is_socket};
use sqlx::PgPool;
use uuid::Uuid;

use crate::observed::store;

/// Observed jobs seen within this long count in their node's health.
pub const NODE_HEALTH_WINDOW_HOURS: i64 = 24;
/// Test figures older than this are no baseline for a job.
pub const BASELINE_WINDOW_DAYS: i64 = 30;

/// What a job is judged against, read from the node.
#[derive(Debug, Default, Clone)]
pub struct NodeContext {
    /// ACTIVE RDMA ports: `device/port (link layer)`.
    pub active_rdma_ports: Vec<String>,
    pub has_recommendations: bool,
    /// The node's latest passing large-message busbw (GB/s) per (`nccl.<collective>`,
    /// nodes in the run).
    pub baselines: HashMap<(String, u32), f64>,
}

/// Judges a job's merged communicators; `env_missing` says a process ran without the
/// environment plugin. Unknown when no rule had anything to judge.
pub fn decide(
    comms: &[ObservedComm],
    env_missing: bool,
    node: &NodeContext,
    below_fraction: f64,
) -> (Verdict, Vec<Reason>) {
    let mut reasons = Vec::new();
    let mut judged = false;
    for c in comms {
        if c.nnodes > 1 && !c.net.is_empty() && !node.active_rdma_ports.is_empty() {
            judged = true;
            if c.transport.as_deref().is_some_and(is_socket) {
                let by_net: Vec<String> = c
                    .net
                    .iter()
                    .map(|n| format!("{} {} bytes", n.net, n.bytes))
                    .collect();
                reasons.push(Reason {
                    severity: Severity::Fail,
                    message: format!(
                        "communicator {} spans {} nodes and moved its bytes over sockets while \
                         {} is ACTIVE: NCCL did not use the RDMA network",
                        c.comm_hash,
                        c.nnodes,
                        node.active_rdma_ports.join(", ")
                    ),
                    metric: None,
                    observed: None,
                    expected: None,
                    basis: "transport".into(),
                    code: Some("job-socket-fallback".into()),
                    evidence: Some(by_net.join(", ")),
                });
            }
        }
        // Per collective, the large-message bands together.
        // Each band's bus bandwidth is from what was timed in it; together they weigh by
        // bytes (total bytes over the summed time each band's bytes took).
        let mut large: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for b in c.bands.iter().filter(|b| b.size_band >= LARGE_BAND) {
            let Some(bw) = b.busbw_gbs.filter(|bw| *bw > 0.0) else {
                continue;
            };
            let e = large.entry(b.func.as_str()).or_default();
            e.0 += b.bytes as f64;
            e.1 += b.bytes as f64 / bw;
        }
        for (func, (bytes, secs_x_gb)) in large {
            if secs_x_gb <= 0.0 {
                continue;
            }
            let busbw = bytes / secs_x_gb;
            let Ok(coll) = heddle_types::collective::canonical_collective(func) else {
                continue;
            };
            let test = format!("nccl.{coll}");
            let Some(&expected) = node.baselines.get(&(test.clone(), c.nnodes)) else {
                continue;
            };
            judged = true;
            if busbw < expected * (1.0 - below_fraction) {
                reasons.push(Reason {
                    severity: Severity::Warn,
                    message: format!(
                        "communicator {}: {func} at 64 MiB and above reached {busbw:.1} GB/s bus \
                         bandwidth, {:.0} % below this node's latest {test} test ({expected:.1} GB/s)",
                        c.comm_hash,
                        (1.0 - busbw / expected) * 100.0
                    ),
                    metric: Some(format!("{test}/busbw_gbs")),
                    observed: Some(busbw),
                    expected: Some(expected),
                    basis: "node-baseline".into(),
                    code: Some("job-below-expected".into()),
                    evidence: None,
                });
            }
        }
    }
    if node.has_recommendations {
        judged = true;
        if env_missing {
            reasons.push(Reason {
                severity: Severity::Warn,
                message: "the job ran without Heddle's environment plugin on a node that has \
                          recommendations: its NCCL settings are not the node's"
                    .into(),
                metric: None,
                observed: None,
                expected: None,
                basis: "environment".into(),
                code: Some("job-env-missing".into()),
                evidence: None,
            });
        }
    }
    reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
    let verdict = match reasons.first().map(|r| r.severity) {
        Some(Severity::Fail) => Verdict::Fail,
        Some(Severity::Warn) => Verdict::Warn,
        _ if judged => Verdict::Pass,
        _ => Verdict::Unknown,
    };
    (verdict, reasons)
}

/// What [`decide`] needs from the node.
pub async fn node_context(db: &PgPool, node_id: Uuid) -> Result<NodeContext, sqlx::Error> {
    let active_rdma_ports: Vec<(String,)> = sqlx::query_as(
        "SELECT coalesce(d->>'name', '?') || '/' || coalesce(p->>'port', '?') || ' (' || coalesce(p->>'link_layer', '?') || ')'
         FROM nodes n,
              jsonb_array_elements(coalesce(n.facts->'rdma'->'devices', '[]')) d,
              jsonb_array_elements(coalesce(d->'ports', '[]')) p
         WHERE n.id = $1 AND jsonb_typeof(n.facts->'rdma'->'devices') = 'array'
           AND jsonb_typeof(d->'ports') = 'array' AND p->>'state' = 'ACTIVE'
         ORDER BY 1",
    )
    .bind(node_id)
    .fetch_all(db)
    .await?;
    let (has_recommendations,): (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM recommendations WHERE node_id = $1)")
            .bind(node_id)
            .fetch_one(db)
            .await?;
    // The latest passing result's largest-band busbw per test and world size.
    let since: DateTime<Utc> = Utc::now() - Duration::days(BASELINE_WINDOW_DAYS);
    let rows: Vec<(String, i32, f64)> = sqlx::query_as(
        "SELECT DISTINCT ON (f->>'test', v.world_size) f->>'test', v.world_size, (f->>'value')::float8
         FROM verdicts v, jsonb_array_elements(v.figures) f
         WHERE v.node_id = $1 AND v.verdict = 'pass' AND v.judged_at >= $2
           AND f->>'metric' = 'busbw_gbs' AND f->>'test' LIKE 'nccl.%' AND (f->>'band')::int >= $3
         ORDER BY f->>'test', v.world_size, v.judged_at DESC, (f->>'band')::int DESC",
    )
    .bind(node_id)
    .bind(since)
    .bind(LARGE_BAND as i32)
    .fetch_all(db)
    .await?;
    Ok(NodeContext {
        active_rdma_ports: active_rdma_ports.into_iter().map(|r| r.0).collect(),
        has_recommendations,
        baselines: rows
            .into_iter()
            .filter_map(|(t, w, v)| Some(((t, u32::try_from(w).ok()?), v)))
            .collect(),
    })
}

/// Judges a stored job and stores its verdict (again: calling it twice is harmless).
pub async fn judge_job(
    db: &PgPool,
    job_id: Uuid,
    below_fraction: f64,
) -> Result<(Verdict, Vec<Reason>), super::HealthError> {
    let (node_id,): (Uuid,) = sqlx::query_as("SELECT node_id FROM observed_jobs WHERE id = $1")
        .bind(job_id)
        .fetch_one(db)
        .await?;
    let rows = store::comm_rows(db, job_id).await?;
    let env_missing = rows.iter().any(|r| r.env_applied.is_none());
    let node = node_context(db, node_id).await?;
    let (verdict, reasons) = decide(&store::merge(&rows), env_missing, &node, below_fraction);
    store::set_verdict(db, job_id, verdict, &reasons).await?;
    Ok((verdict, reasons))
}

/// The reasons of a node's observed jobs seen within [`NODE_HEALTH_WINDOW_HOURS`] that
/// warn or fail, each naming its job, worst first.
pub async fn node_reasons(db: &PgPool, node_id: Uuid) -> Result<Vec<Reason>, super::HealthError> {
    let rows: Vec<(String, sqlx::types::Json<Vec<Reason>>)> = sqlx::query_as(
        "SELECT job_key, reasons FROM observed_jobs
         WHERE node_id = $1 AND verdict IN ('warn', 'fail') AND last_seen_at > now() - make_interval(hours => $2)
         ORDER BY last_seen_at DESC LIMIT 50",
    )
    .bind(node_id)
    .bind(NODE_HEALTH_WINDOW_HOURS as i32)
    .fetch_all(db)
    .await?;
    let mut out: Vec<Reason> = rows
        .into_iter()
        .flat_map(|(key, reasons)| {
            reasons.0.into_iter().map(move |mut r| {
                r.message = format!("observed job {key}: {}", r.message);
                r
            })
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.severity));
    Ok(out)
}

/// Per node (hostname), the combined verdict of its observed jobs seen within
/// [`NODE_HEALTH_WINDOW_HOURS`], and how many jobs had each verdict: for the fleet view and
/// `/metrics`.
pub async fn recent_by_node(db: &PgPool) -> Result<Vec<(Uuid, String, String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT j.node_id, n.hostname, j.verdict, count(*) FROM observed_jobs j JOIN nodes n ON n.id = j.node_id
         WHERE j.last_seen_at > now() - make_interval(hours => $1)
         GROUP BY j.node_id, n.hostname, j.verdict",
    )
    .bind(NODE_HEALTH_WINDOW_HOURS as i32)
    .fetch_all(db)
    .await
}

/// Per node (hostname), observed jobs seen within [`NODE_HEALTH_WINDOW_HOURS`] that fell
/// to sockets (`job-socket-fallback`), for `/metrics`; nodes with none are absent.
pub async fn socket_fallbacks_by_node(db: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT n.hostname, count(*) FROM observed_jobs j JOIN nodes n ON n.id = j.node_id
         WHERE j.last_seen_at > now() - make_interval(hours => $1)
           AND j.reasons @> '[{\"code\": \"job-socket-fallback\"}]'
         GROUP BY n.hostname",
    )
    .bind(NODE_HEALTH_WINDOW_HOURS as i32)
    .fetch_all(db)
    .await
}

#[cfg(test)]
mod tests {
    use heddle_types::observe::NetUse;
    use heddle_types::observed::BandFigure;

    use super::*;

    fn comm(nnodes: u32, net: &[(&str, u64)], busbw_time_ns: u64) -> ObservedComm {
        let net: Vec<NetUse> = net
            .iter()
            .map(|(n, b)| NetUse {
                net: (*n).into(),
                ops: 1,
                bytes: *b,
                inferred: false,
            })
            .collect();
        ObservedComm {
            comm_hash: "c1".into(),
            name: None,
            nranks: 16,
            nnodes,
            local_ranks: 8,
            transport: heddle_types::observed::dominant_net(&net).map(str::to_string),
            net,
            bands: vec![BandFigure {
                func: "AllReduce".into(),
                size_band: 30,
                ops: 1,
                bytes: 1 << 30,
                time_ns: busbw_time_ns,
                algbw_gbs: heddle_types::observed::bandwidths(
                    "AllReduce",
                    16,
                    1 << 30,
                    busbw_time_ns,
                )
                .map(|b| b.0),
                busbw_gbs: heddle_types::observed::bandwidths(
                    "AllReduce",
                    16,
                    1 << 30,
                    busbw_time_ns,
                )
                .map(|b| b.1),
            }],
            finalized: false,
            seq: 1,
            written_at: Utc::now(),
        }
    }

    fn ib_node() -> NodeContext {
        NodeContext {
            active_rdma_ports: vec!["mlx5_0/1 (InfiniBand)".into()],
            has_recommendations: false,
            baselines: HashMap::new(),
        }
    }

    #[test]
    fn sockets_on_an_ib_node_fail() {
        let (v, r) = decide(
            &[comm(2, &[("Socket", 1 << 30)], 1)],
            false,
            &ib_node(),
            0.25,
        );
        assert_eq!(v, Verdict::Fail);
        assert_eq!(r[0].code.as_deref(), Some("job-socket-fallback"));
        assert!(r[0].message.contains("mlx5_0/1"), "{}", r[0].message);
        // Over IB: pass.
        let (v, r) = decide(&[comm(2, &[("IB", 1 << 30)], 1)], false, &ib_node(), 0.25);
        assert_eq!((v, r.len()), (Verdict::Pass, 0));
        // One node: sockets say nothing about the network.
        let (v, _) = decide(
            &[comm(1, &[("Socket", 1 << 30)], 1)],
            false,
            &ib_node(),
            0.25,
        );
        assert_eq!(v, Verdict::Unknown);
        // No ACTIVE RDMA port: sockets are all there is.
        let (v, _) = decide(
            &[comm(2, &[("Socket", 1 << 30)], 1)],
            false,
            &NodeContext::default(),
            0.25,
        );
        assert_eq!(v, Verdict::Unknown);
    }

    #[test]
    fn large_message_busbw_below_the_node_test_warns() {
        let mut node = ib_node();
        node.baselines.insert(("nccl.all_reduce".into(), 2), 100.0);
        // 1 GiB in 10 ms on 16 ranks: algbw 107.4, busbw 201 GB/s: above.
        let (v, _) = decide(&[comm(2, &[("IB", 1)], 10_000_000)], false, &node, 0.25);
        assert_eq!(v, Verdict::Pass);
        // In 40 ms: busbw 50 GB/s, 50 % below 100.
        let (v, r) = decide(&[comm(2, &[("IB", 1)], 40_000_000)], false, &node, 0.25);
        assert_eq!(v, Verdict::Warn);
        assert_eq!(r[0].code.as_deref(), Some("job-below-expected"));
        assert_eq!(r[0].expected, Some(100.0));
        assert!((r[0].observed.unwrap() - 50.3).abs() < 0.1);
        // Within a looser fraction: fine.
        let (v, _) = decide(&[comm(2, &[("IB", 1)], 40_000_000)], false, &node, 0.6);
        assert_eq!(v, Verdict::Pass);
        // A baseline of another node count is not compared.
        let (v, _) = decide(&[comm(4, &[], 40_000_000)], false, &node, 0.25);
        assert_eq!(v, Verdict::Unknown);
    }

    #[test]
    fn env_missing_warns_only_where_there_are_recommendations() {
        let mut node = NodeContext::default();
        assert_eq!(decide(&[], true, &node, 0.25).0, Verdict::Unknown);
        node.has_recommendations = true;
        let (v, r) = decide(&[], true, &node, 0.25);
        assert_eq!(v, Verdict::Warn);
        assert_eq!(r[0].code.as_deref(), Some("job-env-missing"));
        assert_eq!(decide(&[], false, &node, 0.25).0, Verdict::Pass);
    }
}
