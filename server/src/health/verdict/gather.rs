//! Everything a verdict is compared with, read in one statement: the operators' and the
//! node's plugins' expectations, each judged figure's baseline and fleet median, and the
//! newest points of the series the result adds to (what regressions detect on). One round
//! trip whatever the number of figures, checked against the schema at compile time; every
//! list comes back as arrays, one per column, so figures keep their exact `float8` values.

use chrono::{DateTime, Utc};
use heddle_types::health::{Expectation, Figure};
use heddle_types::regress::detect;
use uuid::Uuid;

use super::{BASELINE_RESULTS, FLEET_WINDOW_DAYS, Median};
use crate::health::expectations;
use crate::health::figures::size_band;
use crate::health::regress::{Point, SeriesKey};

/// What to read for one result.
pub struct Ask<'a> {
    pub node_id: Uuid,
    /// Left out of its own medians.
    pub result_id: Uuid,
    pub world_size: i32,
    pub received_at: DateTime<Utc>,
    pub gpu_model: Option<&'a str>,
    /// Operator expectations of these tests.
    pub tests: &'a [String],
    /// The judged figures: a baseline for each, and a fleet median where `fleet` says.
    pub figures: &'a [Figure],
    pub fleet: &'a [bool],
    /// Series of this node and world size whose newest points to read.
    pub series: &'a [SeriesKey],
}

/// What was read.
pub struct Gathered {
    /// By creation, oldest first (as `expectations::from_operators` lists them).
    pub operator: Vec<Expectation>,
    pub plugin: Vec<Expectation>,
    /// One per figure.
    pub baseline: Vec<Option<Median>>,
    /// One per figure; `None` where not asked.
    pub fleet: Vec<Option<Median>>,
    /// One per series: its newest [`detect::MAX_POINTS`] points, oldest first.
    pub points: Vec<Vec<Point>>,
}

struct Row {
    op_id: Vec<Uuid>,
    op_test: Vec<String>,
    op_metric: Vec<String>,
    op_min_size_bytes: Vec<i64>,
    op_value: Vec<f64>,
    op_source: Vec<String>,
    op_gpu_model: Vec<Option<String>>,
    op_gpu_count: Vec<Option<i32>>,
    op_world_size: Vec<Option<i32>>,
    op_hostname: Vec<Option<String>>,
    op_created_by: Vec<String>,
    op_created_at: Vec<DateTime<Utc>>,
    plugin_name: Vec<String>,
    plugin_list: Vec<serde_json::Value>,
    baseline: Vec<Option<f64>>,
    baseline_n: Vec<i64>,
    fleet: Vec<Option<f64>>,
    fleet_n: Vec<i64>,
    point_series: Vec<i64>,
    point_result: Vec<Uuid>,
    point_t: Vec<DateTime<Utc>>,
    point_value: Vec<f64>,
}

/// Reads what `ask` names (through `conn`: a result stored in the same transaction counts).
///
/// Each list is aggregated from a subquery already in its order, so its arrays line up.
/// Per figure `f` (`f.test`, `f.metric`, `f.band`), read with judged figures only
/// (per-pair ones, `figures::pairs`, are followed by regressions and would pull a worst
/// pair's median towards the better pairs):
/// - its baseline: the median of this node's last comparable results judged pass (or
///   unknown: not yet comparable is not a failure), received before this one;
/// - where `f.fleet`, its fleet median: the latest comparable figure of every other node
///   of the same GPU model within the window.
pub async fn gather(conn: &mut sqlx::PgConnection, ask: &Ask<'_>) -> Result<Gathered, sqlx::Error> {
    let f = ask.figures;
    let s = ask.series;
    let row = sqlx::query_as!(
        Row,
        r#"SELECT o.op_id AS "op_id!", o.op_test AS "op_test!", o.op_metric AS "op_metric!",
                o.op_min_size_bytes AS "op_min_size_bytes!", o.op_value AS "op_value!",
                o.op_source AS "op_source!", o.op_gpu_model AS "op_gpu_model!: Vec<Option<String>>",
                o.op_gpu_count AS "op_gpu_count!: Vec<Option<i32>>",
                o.op_world_size AS "op_world_size!: Vec<Option<i32>>",
                o.op_hostname AS "op_hostname!: Vec<Option<String>>", o.op_created_by AS "op_created_by!",
                o.op_created_at AS "op_created_at!", pl.plugin_name AS "plugin_name!",
                pl.plugin_list AS "plugin_list!", m.baseline AS "baseline!: Vec<Option<f64>>",
                m.baseline_n AS "baseline_n!", m.fleet AS "fleet!: Vec<Option<f64>>", m.fleet_n AS "fleet_n!",
                pt.point_series AS "point_series!", pt.point_result AS "point_result!",
                pt.point_t AS "point_t!", pt.point_value AS "point_value!"
         FROM
         (SELECT coalesce(array_agg(e.id), '{}') AS op_id, coalesce(array_agg(e.test), '{}') AS op_test,
                 coalesce(array_agg(e.metric), '{}') AS op_metric,
                 coalesce(array_agg(e.min_size_bytes), '{}') AS op_min_size_bytes,
                 coalesce(array_agg(e.value), '{}') AS op_value, coalesce(array_agg(e.source), '{}') AS op_source,
                 coalesce(array_agg(e.gpu_model), '{}') AS op_gpu_model,
                 coalesce(array_agg(e.gpu_count), '{}') AS op_gpu_count,
                 coalesce(array_agg(e.world_size), '{}') AS op_world_size,
                 coalesce(array_agg(e.hostname), '{}') AS op_hostname,
                 coalesce(array_agg(e.created_by), '{}') AS op_created_by,
                 coalesce(array_agg(e.created_at), '{}') AS op_created_at
          FROM (SELECT e.id, e.test, e.metric, e.min_size_bytes, e.value, e.source, e.gpu_model,
                       e.gpu_count, e.world_size, n.hostname, e.created_by, e.created_at
                FROM expectations e LEFT JOIN nodes n ON n.id = e.node_id
                WHERE e.test = ANY($1) ORDER BY e.created_at) e) o,
         (SELECT coalesce(array_agg(x.name), '{}') AS plugin_name, coalesce(array_agg(x.list), '{}') AS plugin_list
          FROM (SELECT p.name, pr.output->'expectations' AS list
                FROM plugin_results pr JOIN plugins p ON p.id = pr.plugin_id
                WHERE pr.node_id = $2 AND p.enabled AND jsonb_typeof(pr.output->'expectations') = 'array'
                ORDER BY p.name) x) pl,
         (SELECT coalesce(array_agg(x.b), '{}') AS baseline, coalesce(array_agg(x.bn), '{}') AS baseline_n,
                 coalesce(array_agg(x.fl), '{}') AS fleet, coalesce(array_agg(x.fln), '{}') AS fleet_n
          FROM (SELECT b.value AS b, b.n AS bn, fl.value AS fl, fl.n AS fln
                FROM unnest($9::text[], $10::text[], $11::int4[], $12::bool[]) WITH ORDINALITY f(test, metric, band, fleet, i)
                CROSS JOIN LATERAL (
                    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS value, count(*) AS n FROM (
                        SELECT (vf->>'value')::float8 AS x
                        FROM verdicts v, jsonb_array_elements(v.figures) vf
                        WHERE v.node_id = $2 AND v.result_id <> $3 AND v.world_size = $4 AND vf->>'test' = f.test
                          AND vf->>'metric' = f.metric AND (vf->>'band')::int = f.band AND coalesce(vf->>'pair', '') = ''
                          AND v.received_at < $5 AND v.verdict IN ('pass', 'unknown')
                        ORDER BY v.received_at DESC LIMIT $6) s) b
                CROSS JOIN LATERAL (
                    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS value, count(*) AS n FROM (
                        SELECT DISTINCT ON (v.node_id) (vf->>'value')::float8 AS x
                        FROM verdicts v, jsonb_array_elements(v.figures) vf
                        WHERE f.fleet AND v.node_id <> $2 AND v.result_id <> $3 AND v.world_size = $4 AND vf->>'test' = f.test
                          AND vf->>'metric' = f.metric AND (vf->>'band')::int = f.band AND coalesce(vf->>'pair', '') = ''
                          AND v.received_at <= $5 AND v.received_at > $5 - make_interval(days => $7)
                          AND v.gpu_model IS NOT DISTINCT FROM $8
                        ORDER BY v.node_id, v.received_at DESC) s) fl
                ORDER BY f.i) x) m,
         (SELECT coalesce(array_agg(x.i), '{}') AS point_series, coalesce(array_agg(x.result_id), '{}') AS point_result,
                 coalesce(array_agg(x.t), '{}') AS point_t, coalesce(array_agg(x.value), '{}') AS point_value
          FROM (SELECT k.i, p.result_id, p.t, p.value
                FROM unnest($13::text[], $14::text[], $15::int4[], $16::text[]) WITH ORDINALITY k(test, metric, band, pair, i)
                CROSS JOIN LATERAL (
                    SELECT result_id, t, value FROM series_points
                    WHERE node_id = $2 AND test = k.test AND metric = k.metric AND band = k.band AND world_size = $4
                      AND pair = k.pair
                    ORDER BY t DESC, result_id DESC LIMIT $17) p
                ORDER BY k.i, p.t, p.result_id) x) pt"#,
        ask.tests,
        ask.node_id,
        ask.result_id,
        ask.world_size,
        ask.received_at,
        BASELINE_RESULTS,
        FLEET_WINDOW_DAYS,
        ask.gpu_model,
        &f.iter().map(|f| f.test.as_str()).collect::<Vec<_>>() as _,
        &f.iter().map(|f| f.metric.as_str()).collect::<Vec<_>>() as _,
        &f.iter()
            .map(|f| size_band(f.size_bytes))
            .collect::<Vec<_>>(),
        ask.fleet,
        &s.iter().map(|k| k.test.as_str()).collect::<Vec<_>>() as _,
        &s.iter().map(|k| k.metric.as_str()).collect::<Vec<_>>() as _,
        &s.iter().map(|k| k.band).collect::<Vec<_>>(),
        &s.iter().map(|k| k.pair.as_str()).collect::<Vec<_>>() as _,
        detect::MAX_POINTS as i64,
    )
    .fetch_one(conn)
    .await?;
    Ok(row.into_gathered(ask))
}

impl Row {
    fn into_gathered(self, ask: &Ask<'_>) -> Gathered {
        let mut operator = Vec::with_capacity(self.op_id.len());
        for i in 0..self.op_id.len() {
            operator.push(Expectation {
                id: Some(self.op_id[i]),
                origin: "operator".into(),
                test: self.op_test[i].clone(),
                metric: self.op_metric[i].clone(),
                min_size_bytes: self.op_min_size_bytes[i],
                value: self.op_value[i],
                source: self.op_source[i].clone(),
                gpu_model: self.op_gpu_model[i].clone(),
                gpu_count: self.op_gpu_count[i],
                world_size: self.op_world_size[i],
                node: self.op_hostname[i].clone(),
                created_by: Some(self.op_created_by[i].clone()),
                created_at: Some(self.op_created_at[i]),
            });
        }
        let outputs = crate::plugins::outcomes::decode_expectations(
            self.plugin_name.into_iter().zip(self.plugin_list).collect(),
        );
        let plugin = expectations::from_plugin_outputs(outputs);
        let median =
            |value: Option<f64>, samples: i64| value.map(|value| Median { value, samples });
        let baseline = (0..ask.figures.len())
            .map(|i| median(self.baseline[i], self.baseline_n[i]))
            .collect();
        let fleet = (0..ask.figures.len())
            .map(|i| {
                ask.fleet[i]
                    .then(|| median(self.fleet[i], self.fleet_n[i]))
                    .flatten()
            })
            .collect();
        let mut points: Vec<Vec<Point>> = ask.series.iter().map(|_| Vec::new()).collect();
        for i in 0..self.point_series.len() {
            let Some(series) = usize::try_from(self.point_series[i] - 1)
                .ok()
                .and_then(|k| points.get_mut(k))
            else {
                continue;
            };
            series.push(Point {
                result_id: self.point_result[i],
                received_at: self.point_t[i],
                value: self.point_value[i],
            });
        }
        Gathered {
            operator,
            plugin,
            baseline,
            fleet,
            points,
        }
    }
}
