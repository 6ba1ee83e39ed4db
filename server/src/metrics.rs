//! Prometheus metrics: the registry every series is in, and its rendering. Request counters
//! (counted by `http/metrics.rs`) and worker runs (by `workers/`) live in memory per
//! replica; the fleet gauges are read from Postgres at scrape time (`fleet.rs`) so every
//! replica reports the same truth.
//!
//! Names carry base units (`_seconds`, `_bytes_per_second`), counters end in `_total`, and
//! per-node series are labelled the way dcgm-exporter labels its own — `Hostname`, `gpu`
//! (the index), `UUID`, and `device` for an HCA — so a query can join them with DCGM's.
//! The body is OpenMetrics when the scraper asks for it, the Prometheus text format 0.0.4
//! otherwise (docs/metrics.md).

mod fleet;
mod pools;

pub use pools::PoolMetrics;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::http::HeaderMap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(non_snake_case)]
pub struct ProgressLabels {
    /// The job key and owner, as `heddle jobs ls` shows them.
    pub job: String,
    /// `hung` or `straggler`.
    pub state: String,
    /// A node the job runs on (one where a culprit rank is, when there is one).
    pub Hostname: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub worker: String,
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
    observed_progress: Family<ProgressLabels, Gauge>,
    regressions_open: Family<TestLabels, Gauge>,
    worker_runs: Family<WorkerLabels, Counter>,
    worker_errors: Family<WorkerLabels, Counter>,
    worker_duration: Family<WorkerLabels, FloatGauge>,
    history_dropped: Family<TableLabels, Counter>,
    /// The Postgres pools: connections and waits.
    pub pools: PoolMetrics,
    observed_refused: Family<ReasonLabels, Counter>,
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
            observed_progress: Family::default(),
            observed_refused: Family::default(),
            regressions_open: Family::default(),
            worker_runs: Family::default(),
            worker_errors: Family::default(),
            worker_duration: Family::default(),
            history_dropped: Family::default(),
            pools: PoolMetrics::new(&mut registry),
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
            "observed_job_progress",
            "1 for an observed job judged hung (job-hung) or straggling (job-straggler) across its nodes within the last 2 minutes, by job and state",
            m.observed_progress.clone(),
        );
        r.register(
            "observed_refused",
            "Observed-job communicator rows this replica refused, by reason (too-many-rows: the job holds as many as the server keeps per job)",
            m.observed_refused.clone(),
        );
        r.register(
            "regressions_open",
            "Open regressions of the node's test: figures that moved for the worse and stayed (docs/health.md, Regressions); 0 for every test the node has a verdict of",
            m.regressions_open.clone(),
        );
        r.register(
            "worker_runs",
            "Runs of a background worker of this replica (workers/: lease_reaper, heartbeat_flusher, ...)",
            m.worker_runs.clone(),
        );
        r.register(
            "worker_errors",
            "Runs of a background worker of this replica that failed",
            m.worker_errors.clone(),
        );
        r.register_with_unit(
            "worker_last_run_duration",
            "How long the latest run of a background worker of this replica took",
            Unit::Seconds,
            m.worker_duration.clone(),
        );
        r.register(
            "history_partitions_dropped",
            "Monthly partitions of history this replica dropped as expired (docs/health.md, History)",
            m.history_dropped.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Gives a worker's series their first values, so they exist before its first run ends.
    pub fn worker_started(&self, worker: &str) {
        let labels = WorkerLabels {
            worker: worker.into(),
        };
        let _ = self.worker_runs.get_or_create(&labels);
        let _ = self.worker_errors.get_or_create(&labels);
        let _ = self.worker_duration.get_or_create(&labels);
    }

    /// Counts and times one request by its route template (`http/metrics.rs`).
    pub fn request_served(&self, method: String, route: String, status: u16, took: Duration) {
        self.latency
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .observe(took.as_secs_f64());
        self.requests
            .get_or_create(&RequestLabels {
                method,
                route,
                status,
            })
            .inc();
    }

    /// Counts one run of a worker.
    pub fn worker_ran(&self, worker: &str, took: Duration, ok: bool) {
        let labels = WorkerLabels {
            worker: worker.into(),
        };
        self.worker_runs.get_or_create(&labels).inc();
        if !ok {
            self.worker_errors.get_or_create(&labels).inc();
        }
        self.worker_duration
            .get_or_create(&labels)
            .set(took.as_secs_f64());
    }

    /// Counts observed-job rows the server refused, by why (`observed::store`).
    pub fn observed_refused(&self, reason: &str, n: u64) {
        self.observed_refused
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc_by(n);
    }

    /// Counts a dropped partition of `table` (`history::retention`).
    pub fn history_dropped(&self, table: &str) {
        self.history_dropped
            .get_or_create(&TableLabels {
                table: table.into(),
            })
            .inc();
    }

    /// Refreshes the fleet gauges (`fleet.rs`; agents count as online within 2.5
    /// `heartbeat`s) and renders every series in the format the scraper asked for; returns
    /// the content type and the body.
    pub async fn render(
        &self,
        db: &sqlx::PgPool,
        heartbeat: Duration,
        headers: &HeaderMap,
    ) -> Result<(&'static str, String), sqlx::Error> {
        let _one_at_a_time = self.render_lock.lock().await;
        self.pools.sample();
        self.refresh(db, heartbeat).await?;
        Ok(self.encode(headers))
    }

    /// Every series as they stand, in the format the scraper asked for; the content type
    /// and the body.
    pub fn encode(&self, headers: &HeaderMap) -> (&'static str, String) {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        if wants_openmetrics(headers) {
            (OPENMETRICS_CONTENT_TYPE, out)
        } else {
            (TEXT_CONTENT_TYPE, openmetrics_to_text(&out))
        }
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
}
