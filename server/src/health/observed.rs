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
//! - `job-unjudged` (info): no rule had anything to judge, and why (what expectation was
//!   missing for which communicator, and the figure it would have been held to), so an
//!   `unknown` verdict always says why.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Duration, Utc};
use heddle_types::health::{Reason, Severity, Verdict};
use heddle_types::observed::{LARGE_BAND, ObservedComm, band_label, is_socket, path_limit_gbs};
use sqlx::PgPool;
use uuid::Uuid;

use crate::observed::store;

pub mod ranks;

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
    // Per communicator, what no rule could judge it on: the `job-unjudged` reason.
    let mut unjudged: Vec<String> = Vec::new();
    for c in comms {
        let mut missing: Vec<String> = Vec::new();
        if c.nnodes > 1 && !c.net.is_empty() && node.active_rdma_ports.is_empty() {
            missing.push("no ACTIVE RDMA port on this node to hold its transport to".into());
        }
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
        let limit = path_limit_gbs(c.transport.as_deref(), c.nnodes);
        let mut large: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for b in c.bands.iter().filter(|b| b.size_band >= LARGE_BAND) {
            let Some(bw) = b.busbw_gbs.filter(|bw| *bw > 0.0 && *bw <= limit) else {
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
                missing.push(format!(
                    "no passing {test} test on {} node{} here within {BASELINE_WINDOW_DAYS} days \
                     to compare its {func} with",
                    c.nnodes,
                    if c.nnodes == 1 { "" } else { "s" }
                ));
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
        if !c
            .bands
            .iter()
            .any(|b| b.size_band >= LARGE_BAND && b.busbw_gbs.is_some_and(|bw| bw <= limit))
        {
            missing.push(format!(
                "no GPU-timed collective of {} or more to judge its bandwidth on",
                band_label(LARGE_BAND)
            ));
        }
        if !missing.is_empty() {
            unjudged.push(format!(
                "communicator {} ({} rank{} on {} node{} over {}): {}; {}",
                c.comm_hash,
                c.nranks,
                if c.nranks == 1 { "" } else { "s" },
                c.nnodes,
                if c.nnodes == 1 { "" } else { "s" },
                c.transport.as_deref().unwrap_or("no network"),
                missing.join("; "),
                best_figure(c, limit)
            ));
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
    if verdict == Verdict::Unknown {
        if !node.has_recommendations {
            unjudged.push(
                "no recommendations on this node, so Heddle's environment is not expected".into(),
            );
        }
        if comms.is_empty() {
            unjudged.insert(0, "no communicator reported yet".into());
        }
        reasons.push(Reason {
            severity: Severity::Info,
            message: format!("nothing to judge the job on: {}", unjudged.join(". ")),
            metric: None,
            observed: None,
            expected: None,
            basis: "expectation".into(),
            code: Some("job-unjudged".into()),
            evidence: None,
        });
    }
    (verdict, reasons)
}

/// The figure a communicator would have been judged on, for the `job-unjudged` reason:
/// the largest band with a bus bandwidth within its path's limit, else that none was
/// timed on the GPU.
fn best_figure(c: &ObservedComm, limit: f64) -> String {
    match c
        .bands
        .iter()
        .filter_map(|b| Some((b, b.busbw_gbs.filter(|bw| *bw <= limit)?)))
        .max_by_key(|(b, _)| b.size_band)
    {
        Some((b, bw)) => format!(
            "{} reached {bw:.1} GB/s bus bandwidth at {}",
            b.func,
            band_label(b.size_band)
        ),
        None if c.bands.is_empty() => "no operations yet".into(),
        None => "no band was timed on the GPU".into(),
    }
}

/// What [`decide`] needs from the node.
pub async fn node_context(db: &PgPool, node_id: Uuid) -> Result<NodeContext, sqlx::Error> {
    let active_rdma_ports = sqlx::query_scalar!(
        r#"SELECT coalesce(d->>'name', '?') || '/' || coalesce(p->>'port', '?') || ' (' || coalesce(p->>'link_layer', '?') || ')' AS "port!"
         FROM nodes n,
              jsonb_array_elements(coalesce(n.facts->'rdma'->'devices', '[]')) d,
              jsonb_array_elements(coalesce(d->'ports', '[]')) p
         WHERE n.id = $1 AND jsonb_typeof(n.facts->'rdma'->'devices') = 'array'
           AND jsonb_typeof(d->'ports') = 'array' AND p->>'state' = 'ACTIVE'
         ORDER BY 1"#,
        node_id,
    )
    .fetch_all(db)
    .await?;
    let has_recommendations = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM recommendations WHERE node_id = $1) AS "exists!""#,
        node_id,
    )
    .fetch_one(db)
    .await?;
    // The latest passing result's largest-band busbw per test and world size.
    let since: DateTime<Utc> = Utc::now() - Duration::days(BASELINE_WINDOW_DAYS);
    let rows = sqlx::query!(
        r#"SELECT DISTINCT ON (f->>'test', v.world_size) f->>'test' AS "test!", v.world_size,
                (f->>'value')::float8 AS "value!"
         FROM verdicts v, jsonb_array_elements(v.figures) f
         WHERE v.node_id = $1 AND v.verdict = 'pass' AND v.judged_at >= $2
           AND f->>'metric' = 'busbw_gbs' AND f->>'test' LIKE 'nccl.%' AND (f->>'band')::int >= $3
         ORDER BY f->>'test', v.world_size, v.judged_at DESC, (f->>'band')::int DESC"#,
        node_id,
        since,
        LARGE_BAND as i32,
    )
    .fetch_all(db)
    .await?;
    Ok(NodeContext {
        active_rdma_ports,
        has_recommendations,
        baselines: rows
            .into_iter()
            .filter_map(|r| Some(((r.test, u32::try_from(r.world_size).ok()?), r.value)))
            .collect(),
    })
}

/// Judges a stored job and stores its verdict (again: calling it twice is harmless).
pub async fn judge_job(
    db: &PgPool,
    job_id: Uuid,
    below_fraction: f64,
) -> Result<(Verdict, Vec<Reason>), super::HealthError> {
    let node_id = sqlx::query_scalar!("SELECT node_id FROM observed_jobs WHERE id = $1", job_id)
        .fetch_one(db)
        .await?;
    let rows = store::comm_rows(db, job_id).await?;
    let env_missing = rows.iter().any(|r| r.env_applied.is_none());
    let node = node_context(db, node_id).await?;
    let (verdict, reasons) = decide(&store::merge(&rows), env_missing, &node, below_fraction);
    store::set_verdict(db, job_id, verdict, &reasons).await?;
    Ok((verdict, reasons))
}

/// Moves a rank's progress times from its node's clock to the server's.
fn shift(p: &mut heddle_types::observe::Progress, offset_ns: i64) {
    let by = |t: u64| {
        if t == 0 {
            0
        } else {
            t.saturating_add_signed(offset_ns)
        }
    };
    p.now_ns = by(p.now_ns);
    p.last_start_ns = by(p.last_start_ns);
    p.proxy_last_stop_ns = by(p.proxy_last_stop_ns);
    if let Some(f) = &mut p.in_flight {
        f.started_ns = by(f.started_ns);
    }
    for a in &mut p.arrivals {
        a[1] = by(a[1]);
    }
}

/// Judges the ranks of job `job_id` together with the same job's ranks on every other
/// node (`observed::ranks`: one key, one owner) and stores the verdict: hung, straggling,
/// a rank gone silent, or pass when every communicator reported progress and none is.
pub async fn judge_ranks(
    db: &PgPool,
    job_id: Uuid,
    limits: &ranks::Limits,
) -> Result<Verdict, super::HealthError> {
    use heddle_types::observed::RankRow;

    let Some((group, rows)) = crate::observed::ranks::group_ranks(db, job_id).await? else {
        return Ok(Verdict::Unknown);
    };
    let now_ns = Utc::now().timestamp_nanos_opt().unwrap_or(0).max(0) as u64;
    // Per communicator, each rank's newest report (the rows come newest first per rank).
    let mut comms: BTreeMap<&str, (u32, Vec<ranks::RankSample>)> = BTreeMap::new();
    for r in &rows {
        let e = comms
            .entry(r.comm_hash.as_str())
            .or_insert_with(|| (u32::try_from(r.nranks).unwrap_or(0), Vec::new()));
        let rank = u32::try_from(r.rank).unwrap_or(u32::MAX);
        if e.1.last().is_some_and(|s| s.rank == rank) {
            continue;
        }
        let mut progress = r.progress.0.clone();
        shift(&mut progress, r.clock_offset_ns);
        e.1.push(ranks::RankSample {
            node: r.hostname.clone(),
            rank,
            progress,
            finalized: r.finalized,
            silent_s: r.silent_s,
        });
    }
    let mut reasons = Vec::new();
    let mut table = Vec::new();
    for (comm, (nranks, samples)) in &comms {
        let (rs, views) = ranks::judge(comm, *nranks, samples, now_ns, limits);
        reasons.extend(rs);
        for (s, v) in samples.iter().zip(views) {
            let p = &s.progress;
            table.push(RankRow {
                comm_hash: comm.to_string(),
                rank: s.rank,
                hostname: s.node.clone(),
                coll_started: p.coll_started,
                coll_done: p.coll_done,
                in_flight: p.in_flight.clone(),
                // A rank that started nothing has no quiet time to show (not "since 1970").
                quiet_s: if p.last_start_ns == 0 {
                    0.0
                } else {
                    now_ns.saturating_sub(p.last_start_ns) as f64 / 1e9
                },
                lateness_ms: v.lateness_ms,
                silent_s: s.silent_s,
                finalized: s.finalized,
                culprit: v.culprit,
            });
        }
    }
    reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
    let verdict = match reasons.first().map(|r| r.severity) {
        Some(Severity::Fail) => Verdict::Fail,
        Some(Severity::Warn) => Verdict::Warn,
        _ if !comms.is_empty() => Verdict::Pass,
        _ => Verdict::Unknown,
    };
    crate::observed::ranks::set_progress_verdict(db, &group, verdict, &reasons, &table).await?;
    Ok(verdict)
}

/// The reasons of a node's observed jobs seen within [`NODE_HEALTH_WINDOW_HOURS`] that
/// warn or fail, each naming its job, worst first.
pub async fn node_reasons(db: &PgPool, node_id: Uuid) -> Result<Vec<Reason>, super::HealthError> {
    let rows = sqlx::query!(
        r#"SELECT job_key, reasons AS "reasons: sqlx::types::Json<Vec<Reason>>" FROM observed_jobs
         WHERE node_id = $1 AND verdict IN ('warn', 'fail') AND last_seen_at > now() - make_interval(hours => $2)
         ORDER BY last_seen_at DESC LIMIT 50"#,
        node_id,
        NODE_HEALTH_WINDOW_HOURS as i32,
    )
    .fetch_all(db)
    .await?;
    let mut out: Vec<Reason> = rows
        .into_iter()
        .flat_map(|row| {
            let key = row.job_key;
            row.reasons.0.into_iter().map(move |mut r| {
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
    let rows = sqlx::query!(
        r#"SELECT j.node_id, n.hostname, j.verdict, count(*) AS "n!" FROM observed_jobs j JOIN nodes n ON n.id = j.node_id
         WHERE j.last_seen_at > now() - make_interval(hours => $1)
         GROUP BY j.node_id, n.hostname, j.verdict"#,
        NODE_HEALTH_WINDOW_HOURS as i32,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.node_id, r.hostname, r.verdict, r.n))
        .collect())
}

/// Per node (hostname), observed jobs seen within [`NODE_HEALTH_WINDOW_HOURS`] that fell
/// to sockets (`job-socket-fallback`), for `/metrics`; nodes with none are absent.
pub async fn socket_fallbacks_by_node(db: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT n.hostname, count(*) AS "n!" FROM observed_jobs j JOIN nodes n ON n.id = j.node_id
         WHERE j.last_seen_at > now() - make_interval(hours => $1)
           AND j.reasons @> '[{"code": "job-socket-fallback"}]'
         GROUP BY n.hostname"#,
        NODE_HEALTH_WINDOW_HOURS as i32,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.hostname, r.n)).collect())
}

/// Observed jobs judged hung or straggling across their nodes within the last 2 minutes
/// (a job that stopped uploading drops out): (job and owner, `hung` or `straggler`, a node
/// of a culprit rank, else of the job), for `/metrics`.
pub async fn progress_flags(db: &PgPool) -> Result<Vec<(String, String, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT p.job_key || ' (uid ' || p.uid || ')' AS "job!",
                CASE WHEN p.reasons @> '[{"code": "job-hung"}]' THEN 'hung' ELSE 'straggler' END AS "flag!",
                coalesce((SELECT r->>'hostname' FROM jsonb_array_elements(p.ranks) r
                          ORDER BY (r->>'culprit')::boolean DESC LIMIT 1), '') AS "hostname!"
         FROM observed_progress p
         WHERE p.judged_at > now() - interval '2 minutes' AND p.verdict IN ('warn', 'fail')
           AND (p.reasons @> '[{"code": "job-hung"}]' OR p.reasons @> '[{"code": "job-straggler"}]')
         ORDER BY 1 LIMIT 1000"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.job, r.flag, r.hostname))
        .collect())
}

#[cfg(test)]
mod tests;
