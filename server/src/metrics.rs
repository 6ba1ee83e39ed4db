//! Prometheus metrics. Request counters live in memory per replica; fleet gauges (agents
//! online, live jobs by state, the latest verdict and figures per node and test, heartbeat
//! times, GPUs and RDMA ports from the facts, plugin errors) are read from Postgres at
//! scrape time so every replica reports the same truth.
//!
//! Names carry base units (`_seconds`, `_bytes_per_second`), counters end in `_total`, and
//! per-node series are labelled the way dcgm-exporter labels its own — `Hostname`, `gpu`
//! (the index), `UUID`, and `device` for an HCA — so a query can join them with DCGM's.
//! The body is OpenMetrics when the scraper asks for it, the Prometheus text format 0.0.4
//! otherwise (docs/metrics.md).

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::AppState;

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Job states that describe work in flight; finished jobs are history, kept by the API.
const LIVE_JOB_STATES: [heddle_types::jobs::JobState; 3] = [
    heddle_types::jobs::JobState::Queued,
    heddle_types::jobs::JobState::Leased,
    heddle_types::jobs::JobState::Running,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

// Label names as dcgm-exporter spells them, so `on(Hostname)` joins work.
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    pub Hostname: String,
}

#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TestLabels {
    pub Hostname: String,
    pub test: String,
}

#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FigureLabels {
    pub Hostname: String,
    pub test: String,
    /// `busbw` or `algbw`, as nccl-tests name them.
    pub figure: String,
}

#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub Hostname: String,
    pub gpu: String,
    pub UUID: String,
    pub model_name: String,
}

#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    pub Hostname: String,
    pub device: String,
    pub port: String,
    pub link_layer: String,
}

#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub Hostname: String,
    pub verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabels {
    pub table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    agents_online: Gauge,
    jobs: Family<StateLabels, Gauge>,
    verdicts: Family<TestLabels, Gauge>,
    bandwidth: Family<FigureLabels, FloatGauge>,
    test_latency: Family<TestLabels, FloatGauge>,
    socket_fallback: Family<TestLabels, Gauge>,
    heartbeat: Family<HostLabels, FloatGauge>,
    gpus: Family<GpuLabels, Gauge>,
    rdma_ports: Family<PortLabels, Gauge>,
    plugin_errors: Family<PluginLabels, Gauge>,
    observed_jobs: Family<VerdictLabels, Gauge>,
    observed_socket_fallback: Family<HostLabels, Gauge>,
    regressions_open: Family<TestLabels, Gauge>,
    history_dropped: Family<TableLabels, Counter>,
    /// Scrapes clear and refill the per-node families; one at a time.
    render_lock: tokio::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("heddle");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ])
        });
        let m = Metrics {
            registry: Registry::default(),
            requests,
            latency,
            agents_online: Gauge::default(),
            jobs: Family::default(),
            verdicts: Family::default(),
            bandwidth: Family::default(),
            test_latency: Family::default(),
            socket_fallback: Family::default(),
            heartbeat: Family::default(),
            gpus: Family::default(),
            rdma_ports: Family::default(),
            plugin_errors: Family::default(),
            observed_jobs: Family::default(),
            observed_socket_fallback: Family::default(),
            regressions_open: Family::default(),
            history_dropped: Family::default(),
            render_lock: tokio::sync::Mutex::new(()),
        };
        let bytes_per_second = || Unit::Other("bytes_per_second".into());
        let r = &mut registry;
        r.register("http_requests", "HTTP requests served", m.requests.clone());
        r.register_with_unit(
            "http_request_duration",
            "HTTP request latency",
            Unit::Seconds,
            m.latency.clone(),
        );
        r.register(
            "agents_online",
            "Agents that heartbeated within 2.5 intervals",
            m.agents_online.clone(),
        );
        r.register("jobs", "Jobs queued, leased or running now", m.jobs.clone());
        r.register(
            "health_verdict",
            "Latest verdict per node and test: 0 pass, 1 warn, 2 fail, -1 unknown",
            m.verdicts.clone(),
        );
        r.register_with_unit(
            "result_bandwidth",
            "Headline bandwidth of the latest judged result per node and test (busbw or algbw at the largest size)",
            bytes_per_second(),
            m.bandwidth.clone(),
        );
        r.register_with_unit(
            "result_latency",
            "Headline latency of the latest judged result per node and test (at the smallest size)",
            Unit::Seconds,
            m.test_latency.clone(),
        );
        r.register(
            "result_nccl_socket",
            "1 when the latest NCCL result per node and test ran over NCCL's socket transport, 0 over IB/RoCE",
            m.socket_fallback.clone(),
        );
        r.register_with_unit(
            "agent_last_heartbeat_timestamp",
            "Unix time of the node's agent's latest heartbeat",
            Unit::Seconds,
            m.heartbeat.clone(),
        );
        r.register(
            "node_gpu_info",
            "A GPU in the node's latest facts: gpu (the index) and UUID as dcgm-exporter labels them, and its model",
            m.gpus.clone(),
        );
        r.register(
            "node_rdma_port_active",
            "1 when an HCA port in the node's latest facts is ACTIVE, else 0",
            m.rdma_ports.clone(),
        );
        r.register(
            "plugin_errors",
            "Nodes whose latest evaluation by an enabled plugin ended in an error",
            m.plugin_errors.clone(),
        );
        r.register(
            "observed_jobs",
            "Jobs observed on the node (NCCL profiler plugin) within the last 24 h, by verdict",
            m.observed_jobs.clone(),
        );
        r.register(
            "observed_job_socket_fallback",
            "Jobs observed on the node within the last 24 h whose inter-node traffic fell to NCCL's sockets while an RDMA port was ACTIVE",
            m.observed_socket_fallback.clone(),
        );
        r.register(
            "regressions_open",
            "Open regressions of the node's test: figures that moved for the worse and stayed (docs/health.md, Regressions); 0 for every test the node has a verdict of",
            m.regressions_open.clone(),
        );
        r.register(
            "history_partitions_dropped",
            "Monthly partitions of history this replica dropped as expired (docs/health.md, History)",
            m.history_dropped.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Counts a dropped partition of `table` (`history::retention`).
    pub fn history_dropped(&self, table: &str) {
        self.history_dropped
            .get_or_create(&TableLabels {
                table: table.into(),
            })
            .inc();
    }

    /// Refreshes the database-derived gauges and renders them in the format the scraper
    /// asked for; returns the content type and the body.
    pub async fn render(
        &self,
        state: &AppState,
        headers: &HeaderMap,
    ) -> Result<(&'static str, String), sqlx::Error> {
        let _one_at_a_time = self.render_lock.lock().await;
        self.refresh(state).await?;
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        Ok(if wants_openmetrics(headers) {
            (OPENMETRICS_CONTENT_TYPE, out)
        } else {
            (TEXT_CONTENT_TYPE, openmetrics_to_text(&out))
        })
    }

    async fn refresh(&self, state: &AppState) -> Result<(), sqlx::Error> {
        let db = &state.db;
        let online_within = state.config.heartbeat_interval().as_secs_f64() * 2.5;
        let (online,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM agents WHERE revoked_at IS NULL
             AND last_heartbeat_at > now() - make_interval(secs => $1)",
        )
        .bind(online_within)
        .fetch_one(db)
        .await?;
        self.agents_online.set(online);

        let live: Vec<&str> = LIVE_JOB_STATES.iter().map(|s| s.as_str()).collect();
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, count(*) FROM jobs WHERE state = ANY($1) GROUP BY state")
                .bind(&live)
                .fetch_all(db)
                .await?;
        for st in live {
            let n = rows.iter().find(|(s, _)| s == st).map_or(0, |(_, n)| *n);
            self.jobs
                .get_or_create(&StateLabels { state: st.into() })
                .set(n);
        }

        // Per-node families are rebuilt each scrape: a deleted node's series go.
        self.verdicts.clear();
        self.bandwidth.clear();
        self.test_latency.clear();
        self.socket_fallback.clear();
        self.regressions_open.clear();
        for l in crate::health::store::latest_lines(db).await? {
            let verdict = l
                .verdict
                .parse::<heddle_types::health::Verdict>()
                .unwrap_or(heddle_types::health::Verdict::Unknown);
            let labels = TestLabels {
                Hostname: l.hostname.clone(),
                test: l.test.clone(),
            };
            self.verdicts.get_or_create(&labels).set(verdict.gauge());
            // Zero until a regression opens (set below), so the series exists to alert on.
            self.regressions_open.get_or_create(&labels).set(0);
            if let Some(network) = &l.nccl_network {
                let socket = network.eq_ignore_ascii_case("socket");
                self.socket_fallback
                    .get_or_create(&labels)
                    .set(i64::from(socket));
            }
            match (l.metric.as_deref().and_then(base_unit), l.value) {
                (Some(Figure::Bandwidth(figure)), Some(v)) => {
                    self.bandwidth
                        .get_or_create(&FigureLabels {
                            Hostname: l.hostname,
                            test: l.test,
                            figure: figure.into(),
                        })
                        .set(v * 1e9);
                }
                (Some(Figure::Latency), Some(v)) => {
                    self.test_latency.get_or_create(&labels).set(v * 1e-6);
                }
                _ => {}
            }
        }

        self.heartbeat.clear();
        let beats: Vec<(String, f64)> = sqlx::query_as(
            "SELECT n.hostname, extract(epoch FROM max(a.last_heartbeat_at))::float8
             FROM agents a JOIN nodes n ON n.id = a.node_id
             WHERE a.revoked_at IS NULL AND a.last_heartbeat_at IS NOT NULL
             GROUP BY n.hostname",
        )
        .fetch_all(db)
        .await?;
        for (host, at) in beats {
            self.heartbeat
                .get_or_create(&HostLabels { Hostname: host })
                .set(at);
        }

        self.gpus.clear();
        let gpus: Vec<(String, String, String, String)> = sqlx::query_as(
            "SELECT n.hostname, coalesce(g->>'index', ''), coalesce(g->>'uuid', ''),
                    coalesce(g->>'name', '')
             FROM nodes n, jsonb_array_elements(coalesce(n.facts->'gpus', '[]')) g
             WHERE jsonb_typeof(n.facts->'gpus') = 'array'",
        )
        .fetch_all(db)
        .await?;
        for (host, gpu, uuid, model) in gpus {
            self.gpus
                .get_or_create(&GpuLabels {
                    Hostname: host,
                    gpu,
                    UUID: uuid,
                    model_name: model,
                })
                .set(1);
        }

        self.rdma_ports.clear();
        let ports: Vec<(String, String, String, String, bool)> = sqlx::query_as(
            "SELECT n.hostname, coalesce(d->>'name', ''), coalesce(p->>'port', ''),
                    coalesce(p->>'link_layer', ''), coalesce(p->>'state' = 'ACTIVE', false)
             FROM nodes n,
                  jsonb_array_elements(coalesce(n.facts->'rdma'->'devices', '[]')) d,
                  jsonb_array_elements(coalesce(d->'ports', '[]')) p
             WHERE jsonb_typeof(n.facts->'rdma'->'devices') = 'array'
               AND jsonb_typeof(d->'ports') = 'array'",
        )
        .fetch_all(db)
        .await?;
        for (host, device, port, link_layer, active) in ports {
            self.rdma_ports
                .get_or_create(&PortLabels {
                    Hostname: host,
                    device,
                    port,
                    link_layer,
                })
                .set(i64::from(active));
        }

        self.plugin_errors.clear();
        let errors: Vec<(String, i64)> = sqlx::query_as(
            "SELECT p.name, count(r.node_id) FILTER (WHERE r.error IS NOT NULL)
             FROM plugins p LEFT JOIN plugin_results r ON r.plugin_id = p.id
             WHERE p.enabled GROUP BY p.name",
        )
        .fetch_all(db)
        .await?;
        for (plugin, n) in errors {
            self.plugin_errors
                .get_or_create(&PluginLabels { plugin })
                .set(n);
        }
        self.observed_jobs.clear();
        for (_, host, verdict, n) in crate::health::observed::recent_by_node(db).await? {
            self.observed_jobs
                .get_or_create(&VerdictLabels {
                    Hostname: host,
                    verdict,
                })
                .set(n);
        }
        self.observed_socket_fallback.clear();
        for (host, n) in crate::health::observed::socket_fallbacks_by_node(db).await? {
            self.observed_socket_fallback
                .get_or_create(&HostLabels { Hostname: host })
                .set(n);
        }
        for (_, host, test, n) in crate::health::regress::store::open_by_node(db).await? {
            self.regressions_open
                .get_or_create(&TestLabels {
                    Hostname: host,
                    test,
                })
                .set(n);
        }
        Ok(())
    }
}

enum Figure {
    Bandwidth(&'static str),
    Latency,
}

/// What a verdict's metric (`busbw_gbs`, `algbw_gbs`, `time_us`) becomes in base units.
fn base_unit(metric: &str) -> Option<Figure> {
    match metric {
        "busbw_gbs" => Some(Figure::Bandwidth("busbw")),
        "algbw_gbs" => Some(Figure::Bandwidth("algbw")),
        "time_us" => Some(Figure::Latency),
        _ => None,
    }
}

/// True when the Accept header names OpenMetrics (what Prometheus sends first).
pub fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|part| {
            let mut it = part.split(';').map(str::trim);
            let media = it.next()?;
            // An explicit q=0 refuses the type.
            let refused = it.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (!refused).then_some(media)
        })
        .any(|media| media.eq_ignore_ascii_case("application/openmetrics-text"))
}

/// Turns the OpenMetrics exposition into the Prometheus text format 0.0.4: counters are
/// declared under their `_total` name, and `# UNIT` and `# EOF` lines go.
pub fn openmetrics_to_text(om: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some(name) = rest.strip_suffix(" counter")
        {
            counters.insert(name.to_string());
        }
    }
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match rewritten {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Guards `/metrics` when `HEDDLE_METRICS_TOKEN` is set: the scrape must present it as a
/// bearer token. (Per-node health series name every host and how it performs.)
pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    let Some(expected) = state.config.metrics_token.as_deref() else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    // Compared as hashes, so the time taken says nothing about how much of it matched.
    match presented {
        Some(t) if crate::auth::sha256_hex(t) == crate::auth::sha256_hex(expected) => {
            next.run(req).await
        }
        Some(_) => crate::error::ApiError::Unauthorized(
            "wrong metrics token; scrape with the bearer token set in HEDDLE_METRICS_TOKEN".into(),
        )
        .into_response(),
        None => crate::error::ApiError::Unauthorized(
            "/metrics needs `Authorization: Bearer <HEDDLE_METRICS_TOKEN>`".into(),
        )
        .into_response(),
    }
}

/// Middleware counting and timing every request by its route template (not the raw path,
/// which would give one series per node id).
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let start = Instant::now();
    let response = next.run(req).await;
    let m = &state.metrics;
    m.latency
        .get_or_create(&RouteLabels {
            route: route.clone(),
        })
        .observe(start.elapsed().as_secs_f64());
    m.requests
        .get_or_create(&RequestLabels {
            method,
            route,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(axum::http::header::ACCEPT, v.parse().unwrap());
        h
    }

    #[test]
    fn openmetrics_only_when_asked() {
        // What Prometheus 2.x sends.
        assert!(wants_openmetrics(&accept(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(&accept("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(&accept("*/*")));
        assert!(!wants_openmetrics(&HeaderMap::new()));
        assert!(!wants_openmetrics(&accept(
            "application/openmetrics-text;q=0, text/plain"
        )));
    }

    #[test]
    fn text_format_names_counters_with_total_and_drops_openmetrics_lines() {
        let mut registry = Registry::with_prefix("heddle");
        let c: Counter = Counter::default();
        c.inc();
        registry.register("http_requests", "HTTP requests served", c);
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(1.5);
        registry.register_with_unit("result_latency", "x", Unit::Seconds, g);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &registry).unwrap();
        assert!(om.contains("# TYPE heddle_http_requests counter"), "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
        let text = openmetrics_to_text(&om);
        assert!(
            text.contains("# TYPE heddle_http_requests_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# HELP heddle_http_requests_total HTTP requests served"),
            "{text}"
        );
        assert!(text.contains("heddle_http_requests_total 1"), "{text}");
        assert!(text.contains("heddle_result_latency_seconds 1.5"), "{text}");
        assert!(
            !text.contains("# UNIT") && !text.contains("# EOF"),
            "{text}"
        );
    }

    #[test]
    fn figures_become_base_units() {
        assert!(matches!(
            base_unit("busbw_gbs"),
            Some(Figure::Bandwidth("busbw"))
        ));
        assert!(matches!(
            base_unit("algbw_gbs"),
            Some(Figure::Bandwidth("algbw"))
        ));
        assert!(matches!(base_unit("time_us"), Some(Figure::Latency)));
        assert!(base_unit("wrong").is_none());
    }
}
