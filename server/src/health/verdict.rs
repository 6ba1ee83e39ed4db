//! Verdicts on stored results: [`decide`] applies the rules to what is known (pure);
//! `judge.rs` reads what a result is compared with and stores its verdict; a new upload is
//! judged in the transaction that stored it (`upload.rs`), and [`judge_result`] judges a
//! stored result again from Postgres, idempotently.

use chrono::{DateTime, Utc};
#[cfg(test)]
use heddle_types::health::Figure;
use heddle_types::health::{Expectation, Reason, ResultVerdict, Severity, Verdict};
use heddle_types::jobs::{JobSpec, ResultRow};
use heddle_types::kinds::rdma_ab;
use sqlx::PgPool;
use uuid::Uuid;

use super::HealthError;
use super::expectations;
use super::figures::{Extracted, lower_is_better};

/// A node's baseline is the median of its last this many comparable passing results.
pub const BASELINE_RESULTS: i64 = 5;
/// Fewer samples than this (earlier results, or other nodes) make no baseline or median.
pub const MIN_SAMPLES: i64 = 3;
/// Worse than the node's own baseline by more than this: warn.
pub const BASELINE_TOLERANCE: f64 = 0.05;
/// Worse than the fleet median (same GPU model, test, size band, world size) by more than
/// this: warn (an outlier).
pub const FLEET_TOLERANCE: f64 = 0.10;
/// Fleet medians look at the latest figure of each node within this many days.
pub const FLEET_WINDOW_DAYS: i32 = 30;

/// A median and how many samples it was taken over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Median {
    pub value: f64,
    pub samples: i64,
}

/// Everything a figure is compared with.
#[derive(Debug, Clone, Default)]
pub struct Comparisons {
    pub expectations: Vec<Expectation>,
    pub baseline: Option<Median>,
    pub fleet: Option<Median>,
}

fn unit(metric: &str) -> &'static str {
    if metric == rdma_ab::SPEEDUP_METRIC {
        "×"
    } else if lower_is_better(metric) {
        "µs"
    } else {
        "GB/s"
    }
}

fn human_size(bytes: i64) -> String {
    const UNITS: [(i64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (n, u) in UNITS {
        if bytes >= n && bytes % n == 0 {
            return format!("{} {u}", bytes / n);
        }
    }
    format!("{bytes} B")
}

/// How much worse `observed` is than `reference`, as a fraction (negative when better).
fn shortfall(metric: &str, observed: f64, reference: f64) -> f64 {
    if reference <= 0.0 {
        return 0.0;
    }
    if lower_is_better(metric) {
        (observed - reference) / reference
    } else {
        (reference - observed) / reference
    }
}

/// The rules of docs/health.md, in order: a failed outcome fails; a skipped or cancelled
/// one is unknown; wrong elements fail; a figure worse than its expectation fails; worse
/// than the node's baseline by more than 5 % or the fleet median by more than 10 % warns;
/// a result with nothing to compare with is unknown.
pub fn decide(
    outcome: &str,
    failure: Option<&str>,
    extracted: &Extracted,
    per_figure: &[Comparisons],
) -> (Verdict, Vec<Reason>) {
    let mut reasons = Vec::new();
    let why = failure.map(|r| format!(": {r}")).unwrap_or_default();
    match outcome {
        "succeeded" => {}
        "failed" => reasons.push(Reason {
            severity: Severity::Fail,
            message: format!("the test failed{why}"),
            metric: None,
            observed: None,
            expected: None,
            basis: "outcome".into(),
            code: None,
            evidence: None,
        }),
        other => {
            let reason = Reason {
                severity: Severity::Info,
                message: format!("the test was {other}{why}"),
                metric: None,
                observed: None,
                expected: None,
                basis: "outcome".into(),
                code: None,
                evidence: None,
            };
            return (Verdict::Unknown, vec![reason]);
        }
    }
    if extracted.wrong > 0 {
        reasons.push(Reason {
            severity: Severity::Fail,
            message: format!("{} elements failed validation", extracted.wrong),
            metric: Some(format!("{}/wrong", extracted.test)),
            observed: Some(extracted.wrong as f64),
            expected: Some(0.0),
            basis: "validation".into(),
            code: None,
            evidence: None,
        });
    }
    let mut compared = false;
    for (f, cmp) in extracted.figures.iter().zip(per_figure) {
        let name = format!("{}/{}", f.test, f.metric);
        let at = format!(
            "{} {:.2} {} at {}",
            f.test,
            f.value,
            unit(&f.metric),
            human_size(f.size_bytes)
        );
        for e in &cmp.expectations {
            compared = true;
            if shortfall(&f.metric, f.value, e.value) > 0.0 {
                let side = if lower_is_better(&f.metric) {
                    "above the allowed"
                } else {
                    "below the expected"
                };
                let (severity, todo, code) = match expectations::port_rate_rule(e) {
                    Some(sev) => (
                        sev,
                        ": the ports that carried it can do more; look for a renegotiated link \
                         (`ibstatus`), congestion or a transport other than RDMA in this result's \
                         transport reasons",
                        Some(heddle_types::transport::BELOW_PORT_RATE),
                    ),
                    None if f.metric == rdma_ab::SPEEDUP_METRIC => (
                        Severity::Fail,
                        ": RDMA is not clearly faster than TCP sockets where the node's facts say \
                         it should be; look at the RDMA leg's path (a socket fallback, no \
                         GPUDirect RDMA, a wrong NCCL_IB_HCA or GID index) and at the port's rate",
                        Some(rdma_ab::RDMA_NOT_HELPING),
                    ),
                    None => (Severity::Fail, "", None),
                };
                reasons.push(Reason {
                    severity,
                    message: format!("{at} is {side} {:.2} {}{todo}", e.value, unit(&f.metric)),
                    metric: Some(name.clone()),
                    observed: Some(f.value),
                    expected: Some(e.value),
                    basis: format!("expectation:{}", e.source),
                    code: code.map(str::to_string),
                    evidence: None,
                });
            }
        }
        for (median, tolerance, basis, whose) in [
            (
                cmp.baseline,
                BASELINE_TOLERANCE,
                "node-baseline",
                "this node's median",
            ),
            (
                cmp.fleet,
                FLEET_TOLERANCE,
                "fleet-median",
                "the fleet median",
            ),
        ] {
            let Some(m) = median.filter(|m| m.samples >= MIN_SAMPLES) else {
                continue;
            };
            compared = true;
            let off = shortfall(&f.metric, f.value, m.value);
            if off > tolerance {
                reasons.push(Reason {
                    severity: Severity::Warn,
                    message: format!(
                        "{at} is {:.1} % worse than {whose} of {:.2} over {} results (tolerance {:.0} %)",
                        off * 100.0,
                        m.value,
                        m.samples,
                        tolerance * 100.0
                    ),
                    metric: Some(name.clone()),
                    observed: Some(f.value),
                    expected: Some(m.value),
                    basis: basis.into(),
                    code: None,
                    evidence: None,
                });
            }
        }
    }
    reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
    let worst = reasons.first().map(|r| r.severity);
    let verdict = match worst {
        Some(Severity::Fail) => Verdict::Fail,
        Some(Severity::Warn) => Verdict::Warn,
        _ if compared => Verdict::Pass,
        _ => {
            let message = if extracted.figures.is_empty() {
                format!("{} reports no figure to judge", extracted.test)
            } else {
                format!(
                    "nothing to compare with: no expectation applies, and fewer than {MIN_SAMPLES} earlier results on this node or other nodes of its GPU model"
                )
            };
            reasons.push(Reason {
                severity: Severity::Info,
                message,
                metric: None,
                observed: None,
                expected: None,
                basis: "none".into(),
                code: None,
                evidence: None,
            });
            Verdict::Unknown
        }
    };
    (verdict, reasons)
}

struct SubjectRow {
    outcome: String,
    reason: Option<String>,
    summary: serde_json::Value,
    received_at: DateTime<Utc>,
    run_id: Uuid,
    node_id: Uuid,
    world_size: i32,
    spec: sqlx::types::Json<JobSpec>,
    hostname: String,
    gpu_model: Option<String>,
    gpu_count: i32,
    facts: Option<serde_json::Value>,
}

/// A result row's labels as stored.
type Labels = sqlx::types::Json<std::collections::BTreeMap<String, String>>;

struct RowDb {
    size_bytes: i64,
    op: Option<String>,
    time_us: Option<f64>,
    algbw_gbs: Option<f64>,
    busbw_gbs: Option<f64>,
    wrong: Option<i64>,
    labels: Labels,
}

/// Judges results of the last day that have no verdict yet: those whose judgement failed
/// when they were uploaded (the upload itself succeeded, so the agent will not retry). Skips
/// the last few seconds, which the upload handlers are judging themselves. Returns how many
/// were judged; safe on every replica at once (judging is idempotent). A verdict is looked
/// for in its result's month only.
pub async fn judge_pending(db: &PgPool) -> Result<usize, HealthError> {
    let pending = sqlx::query_scalar!(
        "SELECT r.id FROM results r LEFT JOIN verdicts v ON v.result_id = r.id AND v.received_at = r.received_at
         WHERE v.result_id IS NULL AND r.received_at > now() - interval '1 day'
           AND r.received_at < now() - interval '5 seconds'
         ORDER BY r.received_at LIMIT 100",
    )
    .fetch_all(db)
    .await?;
    for id in &pending {
        judge_result(db, *id).await?;
        super::regress::on_result(db, *id).await?;
    }
    Ok(pending.len())
}

/// Judges a stored result and stores the verdict (replacing an earlier one, so calling it
/// again is harmless). History is what was received before the result, so a re-judgement
/// gives the same verdict unless expectations changed. (A new upload is judged in its own
/// transaction by [`upload::judge_upload`].)
pub async fn judge_result(db: &PgPool, result_id: Uuid) -> Result<ResultVerdict, HealthError> {
    let mut tx = db.begin().await?;
    let subject = sqlx::query_as!(
        SubjectRow,
        r#"SELECT r.outcome, r.reason, r.summary, r.received_at, j.run_id, j.node_id, j.world_size,
                ru.spec AS "spec: sqlx::types::Json<JobSpec>",
                n.hostname, n.gpu_model, n.gpu_count, n.facts
         FROM results r JOIN jobs j ON j.id = r.job_id JOIN runs ru ON ru.id = j.run_id JOIN nodes n ON n.id = j.node_id
         WHERE r.id = $1"#,
        result_id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let s = subject.ok_or(HealthError::NoSuchResult(result_id))?;
    let s = Subject {
        outcome: s.outcome,
        reason: s.reason,
        summary: s.summary,
        received_at: s.received_at,
        run_id: s.run_id,
        node_id: s.node_id,
        world_size: s.world_size,
        spec: s.spec.0,
        hostname: s.hostname,
        gpu_model: s.gpu_model,
        gpu_count: s.gpu_count,
        facts: s.facts,
    };
    let rows = sqlx::query_as!(
        RowDb,
        r#"SELECT size_bytes, op, time_us, algbw_gbs, busbw_gbs, wrong,
                labels AS "labels: Labels"
         FROM result_rows WHERE result_id = $1 ORDER BY seq"#,
        result_id,
    )
    .fetch_all(&mut *tx)
    .await?;
    let rows: Vec<ResultRow> = rows
        .into_iter()
        .map(|r| ResultRow {
            size_bytes: r.size_bytes,
            op: r.op,
            time_us: r.time_us,
            algbw_gbs: r.algbw_gbs,
            busbw_gbs: r.busbw_gbs,
            wrong: r.wrong,
            labels: r.labels.0,
            ..Default::default()
        })
        .collect();
    let judged = judge(&mut tx, db, result_id, &s, &rows, Judging::Again).await?;
    tx.commit().await?;
    Ok(judged.verdict)
}

pub mod applied;
mod fleet_memo;
mod gather;
pub mod hung;
mod judge;
pub mod upload;

pub(crate) use judge::{Judging, Subject, judge};

#[cfg(test)]
mod tests;
