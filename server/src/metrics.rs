//! Prometheus metrics. Request counters live in memory per replica; fleet gauges (agents
//! online, jobs by state, the latest verdict and figure per node and test) are read from
//! Postgres at scrape time so every replica reports the same truth.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::AppState;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HealthLabels {
    pub node: String,
    pub test: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FigureLabels {
    pub node: String,
    pub test: String,
    pub metric: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    agents_online: Gauge,
    jobs: Family<StateLabels, Gauge>,
    verdicts: Family<HealthLabels, Gauge>,
    figures: Family<FigureLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
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
        let agents_online = Gauge::default();
        let jobs = Family::<StateLabels, Gauge>::default();
        registry.register("http_requests", "HTTP requests served", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            latency.clone(),
        );
        registry.register(
            "agents_online",
            "Agents that heartbeated within 2.5 intervals",
            agents_online.clone(),
        );
        registry.register("jobs", "Jobs by state", jobs.clone());
        let verdicts = Family::<HealthLabels, Gauge>::default();
        let figures = Family::<FigureLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "health_verdict",
            "Latest verdict per node and test: 0 pass, 1 warn, 2 fail, -1 unknown",
            verdicts.clone(),
        );
        registry.register("health_figure", "Headline figure of the latest judged result per node and test (GB/s, or µs for time_us)", figures.clone());
        Metrics {
            registry,
            requests,
            latency,
            agents_online,
            jobs,
            verdicts,
            figures,
            render_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// Refreshes the database-derived gauges and renders the text exposition format.
    pub async fn render(&self, state: &AppState) -> Result<String, sqlx::Error> {
        let _one_at_a_time = self.render_lock.lock().await;
        let online_within = state.config.heartbeat_interval().as_secs_f64() * 2.5;
        let (online,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM agents WHERE revoked_at IS NULL
             AND last_heartbeat_at > now() - make_interval(secs => $1)",
        )
        .bind(online_within)
        .fetch_one(&state.db)
        .await?;
        self.agents_online.set(online);
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, count(*) FROM jobs GROUP BY state")
                .fetch_all(&state.db)
                .await?;
        for st in heddle_types::jobs::JobState::ALL {
            let n = rows
                .iter()
                .find(|(s, _)| s == st.as_str())
                .map_or(0, |(_, n)| *n);
            self.jobs
                .get_or_create(&StateLabels {
                    state: st.as_str().to_string(),
                })
                .set(n);
        }
        // Latest per node and test only, and rebuilt each scrape: a deleted node's series go.
        let lines = crate::health::store::latest_lines(&state.db).await?;
        self.verdicts.clear();
        self.figures.clear();
        for l in lines {
            let verdict = l
                .verdict
                .parse::<heddle_types::health::Verdict>()
                .unwrap_or(heddle_types::health::Verdict::Unknown);
            self.verdicts
                .get_or_create(&HealthLabels {
                    node: l.hostname.clone(),
                    test: l.test.clone(),
                })
                .set(verdict.gauge());
            if let (Some(metric), Some(value)) = (l.metric, l.value) {
                self.figures
                    .get_or_create(&FigureLabels {
                        node: l.hostname,
                        test: l.test,
                        metric,
                    })
                    .set(value);
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String");
        Ok(out)
    }
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
