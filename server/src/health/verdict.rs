//! Verdicts on stored results: [`decide`] applies the rules to what is known (pure), and
//! [`judge_result`] gathers that from Postgres and stores the verdict, idempotently.

use chrono::{DateTime, Utc};
use heddle_types::health::{Expectation, Figure, Reason, ResultVerdict, Severity, Verdict};
use heddle_types::jobs::{JobSpec, ResultRow};
use heddle_types::kinds::rdma_ab;
use sqlx::PgPool;
use uuid::Uuid;

use super::HealthError;
use super::expectations::{self, Context};
use super::figures::{self, Extracted, lower_is_better, size_band};
use super::transport;

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

#[derive(sqlx::FromRow)]
struct Subject {
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

#[derive(sqlx::FromRow)]
struct RowDb {
    size_bytes: i64,
    op: Option<String>,
    time_us: Option<f64>,
    algbw_gbs: Option<f64>,
    busbw_gbs: Option<f64>,
    wrong: Option<i64>,
    labels: sqlx::types::Json<std::collections::BTreeMap<String, String>>,
}

/// GPUs the test used in all: NCCL's `nranks`, else the `gpus` param per node, else every
/// GPU of a single node.
fn gpus_used(s: &Subject) -> Option<i32> {
    let n = |v: Option<&serde_json::Value>| {
        v.and_then(serde_json::Value::as_i64)
            .and_then(|n| i32::try_from(n).ok())
    };
    n(s.summary.get("nranks"))
        .or_else(|| n(s.spec.params.get("gpus")).map(|g| g * s.world_size))
        .or((s.world_size == 1 && s.gpu_count > 0).then_some(s.gpu_count))
}

type MedianQuery<'q> =
    sqlx::query::QueryAs<'q, sqlx::Postgres, (Option<f64>, i64), sqlx::postgres::PgArguments>;

/// Runs `sql`, a median (`percentile_cont(0.5)`, `count(*)`) over figures comparable with
/// `f`, which are judged figures only: per-pair ones (`figures::pairs`) are followed by
/// regressions and would pull a worst pair's median towards the better pairs. The baseline and the fleet median share what makes a figure comparable, bound here
/// as the first parameters: $1 the node, $2 this result (left out), $3 the world size,
/// $4 to $6 the figure's test, metric and size band, $7 when this result was received;
/// `more` binds the rest.
async fn comparable_median<'q>(
    db: &PgPool,
    sql: &'q str,
    s: &'q Subject,
    result_id: Uuid,
    f: &'q Figure,
    more: impl FnOnce(MedianQuery<'q>) -> MedianQuery<'q>,
) -> Result<Option<Median>, sqlx::Error> {
    let query = sqlx::query_as(sql)
        .bind(s.node_id)
        .bind(result_id)
        .bind(s.world_size)
        .bind(&f.test)
        .bind(&f.metric)
        .bind(size_band(f.size_bytes))
        .bind(s.received_at);
    let (value, samples) = more(query).fetch_one(db).await?;
    Ok(value.map(|value| Median { value, samples }))
}

/// The median of this node's last comparable results judged pass (or unknown: not yet
/// comparable is not a failure), received before this one.
async fn baseline(
    db: &PgPool,
    s: &Subject,
    result_id: Uuid,
    f: &Figure,
) -> Result<Option<Median>, sqlx::Error> {
    let sql = "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x), count(*) FROM (
            SELECT (f->>'value')::float8 AS x
            FROM verdicts v, jsonb_array_elements(v.figures) f
            WHERE v.node_id = $1 AND v.result_id <> $2 AND v.world_size = $3 AND f->>'test' = $4 AND f->>'metric' = $5
              AND (f->>'band')::int = $6 AND coalesce(f->>'pair', '') = ''
              AND v.received_at < $7 AND v.verdict IN ('pass', 'unknown')
            ORDER BY v.received_at DESC LIMIT $8) s";
    comparable_median(db, sql, s, result_id, f, |q| q.bind(BASELINE_RESULTS)).await
}

/// The median of the latest comparable figure of every other node of the same GPU model
/// (a large fleet's remembered for a while: `fleet_memo.rs`).
async fn fleet(
    db: &PgPool,
    s: &Subject,
    result_id: Uuid,
    f: &Figure,
) -> Result<Option<Median>, sqlx::Error> {
    let key = fleet_memo::Key {
        database: db
            .connect_options()
            .get_database()
            .unwrap_or_default()
            .to_string(),
        world_size: s.world_size,
        test: f.test.clone(),
        metric: f.metric.clone(),
        band: size_band(f.size_bytes),
        gpu_model: s.gpu_model.clone(),
    };
    if let Some(median) = fleet_memo::get(&key) {
        return Ok(Some(median));
    }
    let median = fleet_from_db(db, s, result_id, f).await?;
    fleet_memo::put(key, median);
    Ok(median)
}

async fn fleet_from_db(
    db: &PgPool,
    s: &Subject,
    result_id: Uuid,
    f: &Figure,
) -> Result<Option<Median>, sqlx::Error> {
    let sql = "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x), count(*) FROM (
            SELECT DISTINCT ON (v.node_id) (f->>'value')::float8 AS x
            FROM verdicts v, jsonb_array_elements(v.figures) f
            WHERE v.node_id <> $1 AND v.result_id <> $2 AND v.world_size = $3 AND f->>'test' = $4 AND f->>'metric' = $5
              AND (f->>'band')::int = $6 AND coalesce(f->>'pair', '') = ''
              AND v.received_at <= $7 AND v.received_at > $7 - make_interval(days => $8)
              AND v.gpu_model IS NOT DISTINCT FROM $9
            ORDER BY v.node_id, v.received_at DESC) s";
    comparable_median(db, sql, s, result_id, f, |q| {
        q.bind(FLEET_WINDOW_DAYS).bind(&s.gpu_model)
    })
    .await
}

/// Judges results of the last day that have no verdict yet: those whose judgement failed
/// when they were uploaded (the upload itself succeeded, so the agent will not retry). Skips
/// the last few seconds, which the upload handlers are judging themselves. Returns how many
/// were judged; safe on every replica at once (judging is idempotent). A verdict is looked
/// for in its result's month only.
pub async fn judge_pending(db: &PgPool) -> Result<usize, HealthError> {
    let pending: Vec<(Uuid,)> = sqlx::query_as(
        "SELECT r.id FROM results r LEFT JOIN verdicts v ON v.result_id = r.id AND v.received_at = r.received_at
         WHERE v.result_id IS NULL AND r.received_at > now() - interval '1 day'
           AND r.received_at < now() - interval '5 seconds'
         ORDER BY r.received_at LIMIT 100",
    )
    .fetch_all(db)
    .await?;
    for (id,) in &pending {
        judge_result(db, *id).await?;
        super::regress::on_result(db, *id).await?;
    }
    Ok(pending.len())
}

/// Judges a stored result and stores the verdict (replacing an earlier one, so calling it
/// again is harmless). History is what was received before the result, so a re-judgement
/// gives the same verdict unless expectations changed.
pub async fn judge_result(db: &PgPool, result_id: Uuid) -> Result<ResultVerdict, HealthError> {
    let subject: Option<Subject> = sqlx::query_as(
        "SELECT r.outcome, r.reason, r.summary, r.received_at, j.run_id, j.node_id, j.world_size, ru.spec,
                n.hostname, n.gpu_model, n.gpu_count, n.facts
         FROM results r JOIN jobs j ON j.id = r.job_id JOIN runs ru ON ru.id = j.run_id JOIN nodes n ON n.id = j.node_id
         WHERE r.id = $1",
    )
    .bind(result_id)
    .fetch_optional(db)
    .await?;
    let s = subject.ok_or(HealthError::NoSuchResult(result_id))?;
    let rows: Vec<RowDb> = sqlx::query_as(
        "SELECT size_bytes, op, time_us, algbw_gbs, busbw_gbs, wrong, labels FROM result_rows WHERE result_id = $1 ORDER BY seq",
    )
    .bind(result_id)
    .fetch_all(db)
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
    let extracted = figures::extract(&s.spec.kind, &s.spec.params, &rows);
    let node_facts = transport::node_facts(s.facts.as_ref());
    let ctx = Context {
        node_id: s.node_id,
        hostname: s.hostname.clone(),
        gpu_model: s.gpu_model.clone(),
        gpus: gpus_used(&s),
        world_size: s.world_size,
        params: s.spec.params.clone(),
        facts: s.facts.clone(),
        nccl_ports: transport::nccl_ports(&s.summary, node_facts.as_ref()),
        perftest_port: transport::perftest_port(&s.summary),
    };
    let tests: Vec<String> = extracted.figures.iter().map(|f| f.test.clone()).collect();
    let operator = expectations::from_operators(db, &tests).await?;
    let plugin = expectations::from_plugins(db, s.node_id).await?;
    let mut per_figure = Vec::with_capacity(extracted.figures.len());
    for f in &extracted.figures {
        per_figure.push(Comparisons {
            expectations: expectations::deciding(f, &ctx, &operator, &plugin),
            baseline: baseline(db, &s, result_id, f).await?,
            fleet: fleet(db, &s, result_id, f).await?,
        });
    }
    let (verdict, reasons) = decide(&s.outcome, s.reason.as_deref(), &extracted, &per_figure);
    let (verdict, reasons) = if s.outcome == "succeeded" {
        let found = transport::findings(&s.spec.kind, &s.summary, node_facts.as_ref());
        transport::merge(verdict, reasons, found)
    } else if let Some(stage) = hung::stage(&s.summary) {
        let splits = hung::rank_splits(db, s.run_id).await?;
        hung::apply(reasons, stage, s.reason.as_deref(), splits)
    } else {
        (verdict, reasons)
    };
    let mut reasons = reasons;
    if s.outcome == "succeeded" && matches!(verdict, Verdict::Warn | Verdict::Fail) {
        let judged = applied::Judged {
            run: s.run_id,
            node: s.node_id,
            hostname: &s.hostname,
            test: &extracted.test,
            result: result_id,
        };
        reasons.extend(applied::reason(db, judged).await?);
    }
    // The judged figures, then the per-pair ones regressions follow (`figures::pairs`).
    let mut all_figures = extracted.figures.clone();
    all_figures.extend(figures::pairs(&s.spec.kind, &rows));
    let stored_figures: Vec<serde_json::Value> = all_figures.iter().map(figures::stored).collect();
    let headline = extracted.figures.first();
    let reasons_json = serde_json::to_value(&reasons).map_err(|source| HealthError::Decode {
        what: "reasons",
        source,
    })?;
    let figures_json = serde_json::Value::Array(stored_figures);
    // The verdict, the node's latest verdict of the test, and the result's series points
    // with their rollups (`history::points`), together.
    let mut tx = db.begin().await?;
    let (judged_at,): (DateTime<Utc>,) = sqlx::query_as(
        "WITH v AS (
            INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, reasons, metric, value, judged_at, figures,
                                  world_size, gpu_model, received_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now(), $9, $10, $11, $12)
            ON CONFLICT (result_id, received_at) DO UPDATE SET test = EXCLUDED.test, verdict = EXCLUDED.verdict,
               reasons = EXCLUDED.reasons, metric = EXCLUDED.metric, value = EXCLUDED.value, judged_at = now(),
               figures = EXCLUDED.figures, world_size = EXCLUDED.world_size, gpu_model = EXCLUDED.gpu_model
            RETURNING *),
         latest AS (
            INSERT INTO latest_verdicts (node_id, test, result_id, run_id, verdict, reasons, metric, value, judged_at,
                                         figures, world_size, gpu_model, received_at)
            SELECT node_id, test, result_id, run_id, verdict, reasons, metric, value, judged_at, figures, world_size,
                   gpu_model, received_at FROM v
            ON CONFLICT (node_id, test) DO UPDATE SET result_id = EXCLUDED.result_id, run_id = EXCLUDED.run_id,
               verdict = EXCLUDED.verdict, reasons = EXCLUDED.reasons, metric = EXCLUDED.metric, value = EXCLUDED.value,
               judged_at = EXCLUDED.judged_at, figures = EXCLUDED.figures, world_size = EXCLUDED.world_size,
               gpu_model = EXCLUDED.gpu_model, received_at = EXCLUDED.received_at
            WHERE latest_verdicts.judged_at <= EXCLUDED.judged_at)
         SELECT judged_at FROM v",
    )
    .bind(result_id)
    .bind(s.run_id)
    .bind(s.node_id)
    .bind(&extracted.test)
    .bind(verdict.as_str())
    .bind(&reasons_json)
    .bind(headline.map(|f| f.metric.clone()))
    .bind(headline.map(|f| f.value))
    .bind(&figures_json)
    .bind(s.world_size)
    .bind(&s.gpu_model)
    .bind(s.received_at)
    .fetch_one(&mut *tx)
    .await?;
    if s.outcome == "succeeded" {
        let judged = crate::history::points::Judged {
            node_id: s.node_id,
            result_id,
            received_at: s.received_at,
            world_size: s.world_size,
            figures: &figures_json,
        };
        crate::history::points::record(&mut tx, &judged).await?;
    }
    tx.commit().await?;
    tracing::debug!(%result_id, node = %s.hostname, test = %extracted.test, %verdict, "judged a result");
    Ok(ResultVerdict {
        result_id,
        verdict,
        test: extracted.test,
        metric: headline.map(|f| f.metric.clone()),
        value: headline.map(|f| f.value),
        reasons,
        figures: all_figures,
        judged_at,
    })
}

pub mod applied;
mod fleet_memo;
pub mod hung;

#[cfg(test)]
mod tests;
