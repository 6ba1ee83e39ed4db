//! The fleet gauges of `/metrics` (agents online, live jobs by state, the latest verdict and
//! figures per node and test, heartbeat times, GPUs and RDMA ports from the facts, plugin
//! errors, observed jobs, open regressions), read from Postgres at each scrape so every
//! replica reports the same fleet and a deleted node's series go at the next one.

use std::time::Duration;

use super::{
    FigureLabels, GpuLabels, HostLabels, Metrics, PluginLabels, PortLabels, ProgressLabels,
    StateLabels, TestLabels, VerdictLabels,
};

/// Job states that describe work in flight; finished jobs are history, kept by the API.
const LIVE_JOB_STATES: [heddle_types::jobs::JobState; 3] = [
    heddle_types::jobs::JobState::Queued,
    heddle_types::jobs::JobState::Leased,
    heddle_types::jobs::JobState::Running,
];

impl Metrics {
    pub(super) async fn refresh(
        &self,
        db: &sqlx::PgPool,
        heartbeat: Duration,
    ) -> Result<(), sqlx::Error> {
        let online_within = heartbeat.as_secs_f64() * 2.5;
        let online = sqlx::query_scalar!(
            r#"SELECT count(*) AS "online!" FROM agents WHERE revoked_at IS NULL
             AND last_heartbeat_at > now() - make_interval(secs => $1)"#,
            online_within,
        )
        .fetch_one(db)
        .await?;
        self.agents_online.set(online);

        let live: Vec<&str> = LIVE_JOB_STATES.iter().map(|s| s.as_str()).collect();
        let rows: Vec<(String, i64)> = sqlx::query!(
            r#"SELECT state, count(*) AS "n!" FROM jobs WHERE state = ANY($1) GROUP BY state"#,
            &live as &[&str],
        )
        .fetch_all(db)
        .await?
        .into_iter()
        .map(|r| (r.state, r.n))
        .collect();
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
        let beats = sqlx::query!(
            r#"SELECT n.hostname, extract(epoch FROM max(a.last_heartbeat_at))::float8 AS "at!"
             FROM agents a JOIN nodes n ON n.id = a.node_id
             WHERE a.revoked_at IS NULL AND a.last_heartbeat_at IS NOT NULL
             GROUP BY n.hostname"#,
        )
        .fetch_all(db)
        .await?;
        for (host, at) in beats.into_iter().map(|b| (b.hostname, b.at)) {
            self.heartbeat
                .get_or_create(&HostLabels { Hostname: host })
                .set(at);
        }

        self.gpus.clear();
        let gpus = sqlx::query!(
            r#"SELECT n.hostname, coalesce(g->>'index', '') AS "gpu!",
                    coalesce(g->>'uuid', '') AS "uuid!", coalesce(g->>'name', '') AS "model!"
             FROM nodes n, jsonb_array_elements(coalesce(n.facts->'gpus', '[]')) g
             WHERE jsonb_typeof(n.facts->'gpus') = 'array'"#,
        )
        .fetch_all(db)
        .await?;
        for (host, gpu, uuid, model) in gpus
            .into_iter()
            .map(|g| (g.hostname, g.gpu, g.uuid, g.model))
        {
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
        let ports = sqlx::query!(
            r#"SELECT n.hostname, coalesce(d->>'name', '') AS "device!",
                    coalesce(p->>'port', '') AS "port!",
                    coalesce(p->>'link_layer', '') AS "link_layer!",
                    coalesce(p->>'state' = 'ACTIVE', false) AS "active!"
             FROM nodes n,
                  jsonb_array_elements(coalesce(n.facts->'rdma'->'devices', '[]')) d,
                  jsonb_array_elements(coalesce(d->'ports', '[]')) p
             WHERE jsonb_typeof(n.facts->'rdma'->'devices') = 'array'
               AND jsonb_typeof(d->'ports') = 'array'"#,
        )
        .fetch_all(db)
        .await?;
        for (host, device, port, link_layer, active) in ports
            .into_iter()
            .map(|p| (p.hostname, p.device, p.port, p.link_layer, p.active))
        {
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
        let errors = sqlx::query!(
            r#"SELECT p.name, count(r.node_id) FILTER (WHERE r.error IS NOT NULL) AS "errors!"
             FROM plugins p LEFT JOIN plugin_results r ON r.plugin_id = p.id
             WHERE p.enabled GROUP BY p.name"#,
        )
        .fetch_all(db)
        .await?;
        for (plugin, n) in errors.into_iter().map(|e| (e.name, e.errors)) {
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
        self.observed_progress.clear();
        for (job, state, host) in crate::health::observed::progress_flags(db).await? {
            self.observed_progress
                .get_or_create(&ProgressLabels {
                    job,
                    state,
                    Hostname: host,
                })
                .set(1);
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

#[cfg(test)]
mod tests {
    use super::*;

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
