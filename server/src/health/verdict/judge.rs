//! The judgement of one result: everything it is compared with read in one statement
//! (`gather.rs`), [`decide`](super::decide), and the verdict, the node's latest verdict and
//! the series points written, all through the caller's connection (its transaction).

use chrono::{DateTime, Utc};
use heddle_types::health::{Expectation, Figure, ResultVerdict, Verdict};
use heddle_types::jobs::{JobSpec, ResultRow};
use heddle_types::regress::detect;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Comparisons, Median, applied, decide, fleet_memo, gather, hung};
use crate::health::HealthError;
use crate::health::expectations::{self, Context};
use crate::health::figures::{self, size_band};
use crate::health::regress::{Point, SeriesKey};
use crate::health::transport;

/// A stored result as judging needs it: the result, its job, run and node.
pub(crate) struct Subject {
    pub outcome: String,
    pub reason: Option<String>,
    pub summary: serde_json::Value,
    pub received_at: DateTime<Utc>,
    pub run_id: Uuid,
    pub node_id: Uuid,
    pub world_size: i32,
    pub spec: JobSpec,
    pub hostname: String,
    pub gpu_model: Option<String>,
    pub gpu_count: i32,
    pub facts: Option<serde_json::Value>,
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

/// Whether a result is judged for the first time (it has no verdict, no series points) or
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judging {
    /// Its series' newest points are read too, for regressions.
    First,
    Again,
}

/// A verdict stored, with what regressions need of it when judged first.
pub(crate) struct Judged {
    pub verdict: ResultVerdict,
    /// Operator expectations of the result's tests and kinds (the detector's settings).
    pub operator: Vec<Expectation>,
    /// Each series the result added a point to, with its newest points, oldest first,
    /// this result's included.
    pub series: Vec<(SeriesKey, Vec<Point>)>,
}

/// Judges `s` with its `rows` and stores the verdict, the node's latest verdict and the
/// series points through `conn`, in the caller's transaction: one read of everything the
/// figures are compared with (`gather.rs`), then the writes.
pub(crate) async fn judge(
    conn: &mut sqlx::PgConnection,
    db: &PgPool,
    result_id: Uuid,
    s: &Subject,
    rows: &[ResultRow],
    judging: Judging,
) -> Result<Judged, HealthError> {
    let extracted = figures::extract(&s.spec.kind, &s.spec.params, rows);
    let node_facts = transport::node_facts(s.facts.as_ref());
    let ctx = Context {
        node_id: s.node_id,
        hostname: s.hostname.clone(),
        gpu_model: s.gpu_model.clone(),
        gpus: gpus_used(s),
        world_size: s.world_size,
        params: s.spec.params.raw().clone(),
        facts: s.facts.clone(),
        nccl_ports: transport::nccl_ports(&s.summary, node_facts.as_ref()),
        perftest_port: transport::perftest_port(&s.summary),
    };
    // The judged figures, then the per-pair ones regressions follow (`figures::pairs`).
    let mut all_figures = extracted.figures.clone();
    all_figures.extend(figures::pairs(&s.spec.kind, rows));
    let series = if judging == Judging::First && s.outcome == "succeeded" {
        series_of(s, &all_figures)
    } else {
        Vec::new()
    };
    let mut tests: Vec<String> = extracted.figures.iter().map(|f| f.test.clone()).collect();
    for key in &series {
        tests.push(key.test.clone());
        tests.push(key.test.split('.').next().unwrap_or(&key.test).to_string());
    }
    tests.sort();
    tests.dedup();
    let memo_keys: Vec<fleet_memo::Key> = extracted
        .figures
        .iter()
        .map(|f| fleet_memo::Key {
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
        })
        .collect();
    let remembered: Vec<Option<Median>> = memo_keys.iter().map(fleet_memo::get).collect();
    let read_fleet: Vec<bool> = remembered.iter().map(Option::is_none).collect();
    let got = gather::gather(
        conn,
        &gather::Ask {
            node_id: s.node_id,
            result_id,
            world_size: s.world_size,
            received_at: s.received_at,
            gpu_model: s.gpu_model.as_deref(),
            tests: &tests,
            figures: &extracted.figures,
            fleet: &read_fleet,
            series: &series,
        },
    )
    .await?;
    let mut per_figure = Vec::with_capacity(extracted.figures.len());
    for (i, f) in extracted.figures.iter().enumerate() {
        let fleet = match remembered[i] {
            Some(m) => Some(m),
            None => {
                fleet_memo::put(memo_keys[i].clone(), got.fleet[i]);
                got.fleet[i]
            }
        };
        per_figure.push(Comparisons {
            expectations: expectations::deciding(f, &ctx, &got.operator, &got.plugin),
            baseline: got.baseline[i],
            fleet,
        });
    }
    let (verdict, reasons) = decide(&s.outcome, s.reason.as_deref(), &extracted, &per_figure);
    let (verdict, reasons) = if s.outcome == "succeeded" {
        let found = transport::findings(&s.spec.kind, &s.summary, node_facts.as_ref());
        transport::merge(verdict, reasons, found)
    } else if let Some(stage) = hung::stage(&s.summary) {
        let splits = hung::rank_splits(&mut *conn, s.run_id).await?;
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
        reasons.extend(applied::reason(&mut *conn, judged).await?);
    }
    let stored_figures: Vec<serde_json::Value> = all_figures.iter().map(figures::stored).collect();
    let headline = extracted.figures.first();
    let reasons_json = serde_json::to_value(&reasons).map_err(|source| HealthError::Decode {
        what: "reasons",
        source,
    })?;
    let figures_json = serde_json::Value::Array(stored_figures);
    // The verdict and the node's latest verdict of the test, together; then the result's
    // series points with their rollups (`history::points`).
    let judged_at: DateTime<Utc> = sqlx::query_scalar!(
        r#"WITH v AS (
            INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, reasons, metric, value, judged_at, figures,
                                  world_size, gpu_model, received_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp(), $9, $10, $11, $12)
            ON CONFLICT (result_id, received_at) DO UPDATE SET test = EXCLUDED.test, verdict = EXCLUDED.verdict,
               reasons = EXCLUDED.reasons, metric = EXCLUDED.metric, value = EXCLUDED.value, judged_at = EXCLUDED.judged_at,
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
         SELECT judged_at AS "judged_at!" FROM v"#,
        result_id,
        s.run_id,
        s.node_id,
        extracted.test,
        verdict.as_str(),
        reasons_json,
        headline.map(|f| f.metric.clone()),
        headline.map(|f| f.value),
        figures_json,
        s.world_size,
        s.gpu_model,
        s.received_at,
    )
    .fetch_one(&mut *conn)
    .await?;
    if s.outcome == "succeeded" {
        let judged = crate::history::points::Judged {
            node_id: s.node_id,
            result_id,
            received_at: s.received_at,
            world_size: s.world_size,
            figures: &figures_json,
        };
        match judging {
            Judging::First => crate::history::points::record_first(&mut *conn, &judged).await?,
            Judging::Again => crate::history::points::record(&mut *conn, &judged).await?,
        }
    }
    tracing::debug!(%result_id, node = %s.hostname, test = %extracted.test, %verdict, "judged a result");
    // Each series' newest points as `series_points` now holds them: those read, and this
    // result's (a figure without a finite value has none).
    let mut series_points = got.points;
    for (key, points) in series.iter().zip(&mut series_points) {
        for f in &all_figures {
            if f.value.is_finite() && key_of(s, f) == *key {
                points.push(Point {
                    result_id,
                    received_at: s.received_at,
                    value: f.value,
                });
            }
        }
        points.sort_by_key(|p| (p.received_at, p.result_id));
        let extra = points.len().saturating_sub(detect::MAX_POINTS);
        points.drain(..extra);
    }
    Ok(Judged {
        verdict: ResultVerdict {
            result_id,
            verdict,
            test: extracted.test,
            metric: headline.map(|f| f.metric.clone()),
            value: headline.map(|f| f.value),
            reasons,
            figures: all_figures,
            judged_at,
        },
        operator: got.operator,
        series: series.into_iter().zip(series_points).collect(),
    })
}

/// The series a figure's point belongs to.
fn key_of(s: &Subject, f: &Figure) -> SeriesKey {
    SeriesKey {
        node_id: s.node_id,
        test: f.test.clone(),
        metric: f.metric.clone(),
        band: size_band(f.size_bytes),
        world_size: s.world_size,
        pair: f.pair.clone().unwrap_or_default(),
    }
}

/// The series a succeeded result's figures add points to, each once (a figure without a
/// finite value adds none: `history::points` stores only numbers).
fn series_of(s: &Subject, figures: &[Figure]) -> Vec<SeriesKey> {
    let mut keys: Vec<SeriesKey> = figures
        .iter()
        .filter(|f| f.value.is_finite())
        .map(|f| key_of(s, f))
        .collect();
    keys.sort_by(|a, b| {
        (&a.test, &a.metric, a.band, &a.pair).cmp(&(&b.test, &b.metric, b.band, &b.pair))
    });
    keys.dedup();
    keys
}
