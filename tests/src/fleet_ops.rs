//! What the fault scenarios of the fleet test share (`fleet_faults.rs`, `fleet_db_faults.rs`):
//! starting Postgres, two replicas and agents, the admin API, waiting for runs, and the
//! exactly-once check of every result in Postgres.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use heddle_testkit::Api;
use reqwest::Method;
use serde_json::{Value, json};

use crate::fleet::{Fleet, wait_for};

pub const ADMIN: &str = "hdl_fleet-admin-token-0000000000000000000000000000";
pub const PG_ISREADY: &str = "/usr/lib/postgresql/15/bin/pg_isready";
pub const STATE_DIR: &str = "/var/lib/heddle-agent";
pub const REPLICAS: [&str; 2] = ["srv-a", "srv-b"];

/// One agent container: its name, and what it gets besides the common settings.
pub struct AgentSpec<'a> {
    pub node: &'a str,
    pub env: Vec<(&'a str, String)>,
    pub docker_args: Vec<&'a str>,
}

pub struct Cluster {
    pub fleet: Fleet,
    /// The admin at no replica in particular: each call names one (`on`).
    pub api: Api,
    pub t0: Instant,
    pub tag: &'static str,
}

impl Cluster {
    pub fn new(tag: &'static str) -> anyhow::Result<Cluster> {
        Ok(Cluster {
            fleet: Fleet::new()?,
            api: Api {
                base: String::new(),
                token: ADMIN.into(),
                // Longer than the server's 5 s wait for a pooled connection.
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(15))
                    .build()?,
            },
            t0: Instant::now(),
            tag,
        })
    }

    pub fn step(&self, what: &str) {
        eprintln!(
            "{}: [{:>6.1} s] {what}",
            self.tag,
            self.t0.elapsed().as_secs_f64()
        );
    }

    pub fn url(&self, server: &str) -> anyhow::Result<String> {
        Ok(format!("http://{}:8080", self.fleet.ip(server)?))
    }

    pub fn sql(&self, query: &str) -> anyhow::Result<String> {
        self.fleet.sql("pg", query)
    }

    pub fn pg_ready(&self) -> bool {
        let args = [
            PG_ISREADY,
            "-h",
            "127.0.0.1",
            "-d",
            "heddle",
            "-U",
            "postgres",
        ];
        self.fleet.exec("pg", &args).is_ok()
    }

    pub async fn wait_pg(&self) -> anyhow::Result<()> {
        wait_for("Postgres", Duration::from_secs(60), || async {
            Ok(self.pg_ready().then_some(()))
        })
        .await
    }

    /// The replicas' environment: `HEDDLE_HEARTBEAT_INTERVAL_S=heartbeat_s` and `extra`.
    pub fn server_env(
        heartbeat_s: u64,
        extra: &[(&'static str, String)],
    ) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (
                "HEDDLE_DATABASE_URL",
                "postgres://postgres@pg:5432/heddle".to_string(),
            ),
            ("HEDDLE_ADMIN_TOKEN", ADMIN.to_string()),
            ("HEDDLE_HEARTBEAT_INTERVAL_S", heartbeat_s.to_string()),
            ("HEDDLE_LOG_JSON", "false".to_string()),
        ];
        env.extend(extra.iter().cloned());
        env
    }

    /// Waits up to `timeout` until replica `server` answers `/readyz` with 200.
    pub async fn wait_ready(&self, server: &str, timeout: Duration) -> anyhow::Result<()> {
        let url = self.url(server)?;
        wait_for(&format!("{server} ready"), timeout, || async {
            Ok(self
                .get(&url, "/readyz")
                .await
                .ok()
                .filter(|(s, _)| *s == 200)
                .map(|_| ()))
        })
        .await
    }

    /// Enrolls the agents with one token (through `srv-a`) and waits until every one has
    /// heartbeated and sent facts.
    pub async fn start_agents(&mut self, agents: Vec<AgentSpec<'_>>) -> anyhow::Result<()> {
        let a = self.url("srv-a")?;
        let token = self
            .post(
                &a,
                "/api/v1/enrollment-tokens",
                json!({"max_uses": agents.len()}),
            )
            .await?;
        let token = token["token"]
            .as_str()
            .context("enrollment token")?
            .to_string();
        let n = agents.len();
        for spec in agents {
            let mut env = vec![
                (
                    "HEDDLE_SERVER",
                    "http://srv-a:8080,http://srv-b:8080".to_string(),
                ),
                ("HEDDLE_ENROLL_TOKEN", token.clone()),
                ("HEDDLE_CLAIM_INTERVAL", "1s".to_string()),
                ("HEDDLE_BACKOFF_CAP", "2s".to_string()),
                ("HEDDLE_LOG", "info".to_string()),
            ];
            env.extend(spec.env);
            let mut args = vec!["--cap-add", "IPC_LOCK"];
            args.extend(spec.docker_args);
            self.fleet.run(spec.node, "heddle-agent", &env, &args)?;
        }
        wait_for("agents with facts", Duration::from_secs(90), || async {
            let c = self.sql(
                "SELECT count(*) FROM nodes n JOIN agents a ON a.node_id = n.id
                 WHERE n.facts IS NOT NULL AND a.revoked_at IS NULL
                   AND a.last_heartbeat_at > now() - interval '20 seconds'",
            )?;
            Ok((c == n.to_string()).then_some(()))
        })
        .await
    }

    pub async fn get(&self, base: &str, path: &str) -> anyhow::Result<(u16, String)> {
        let (status, text) = self.api.on(base).try_call(Method::GET, path, None).await?;
        Ok((status.as_u16(), text))
    }

    pub async fn get_json(&self, base: &str, path: &str) -> anyhow::Result<Value> {
        let (status, body) = self.get(base, path).await?;
        ensure!((200..300).contains(&status), "GET {path}: {status}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    pub async fn post(&self, base: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        self.api
            .on(base)
            .try_ok(Method::POST, path, Some(body))
            .await
    }

    pub async fn start_run(
        &self,
        base: &str,
        kind: &str,
        params: Value,
        nodes: &[&str],
    ) -> anyhow::Result<String> {
        let run = self
            .post(
                base,
                "/api/v1/runs",
                json!({"kind": kind, "params": params, "nodes": nodes, "timeout_s": 300}),
            )
            .await?;
        Ok(run["id"].as_str().context("run without id")?.to_string())
    }

    /// Waits until every job of the run has ended, asking whichever replica answers.
    pub async fn finished(&self, id: &str, timeout: Duration) -> anyhow::Result<Value> {
        wait_for(&format!("run {id} to finish"), timeout, || async {
            for server in REPLICAS {
                let Ok(base) = self.url(server) else { continue };
                if let Ok(run) = self.get_json(&base, &format!("/api/v1/runs/{id}")).await {
                    let done = run["jobs"].as_array().is_some_and(|jobs| {
                        jobs.iter().all(|j| {
                            !matches!(j["state"].as_str(), Some("queued" | "leased" | "running"))
                        })
                    });
                    return Ok(done.then_some(run));
                }
            }
            Ok(None)
        })
        .await
    }

    /// Exactly once, over every job in the database: a `succeeded` or `skipped` job has one
    /// row in `results`, no job has two. Returns (jobs, results).
    pub fn assert_all_results_once(&self) -> anyhow::Result<(u64, u64)> {
        let wrong = self.sql(
            "SELECT j.id, j.state, count(r.id) FROM jobs j LEFT JOIN results r ON r.job_id = j.id
             GROUP BY j.id, j.state
             HAVING count(r.id) > 1 OR (j.state IN ('succeeded', 'skipped') AND count(r.id) <> 1)",
        )?;
        ensure!(wrong.is_empty(), "jobs without exactly one result: {wrong}");
        let jobs: u64 = self.sql("SELECT count(*) FROM jobs")?.parse()?;
        let results: u64 = self.sql("SELECT count(*) FROM results")?.parse()?;
        Ok((jobs, results))
    }

    /// Every job of the run succeeded.
    pub fn ensure_succeeded(run: &Value) -> anyhow::Result<()> {
        for j in run["jobs"].as_array().context("run without jobs")? {
            ensure!(j["state"] == "succeeded", "job did not succeed: {j}");
        }
        Ok(())
    }
}

/// A duration from the environment variable `var` in seconds, else `default`.
pub fn secs_from_env(var: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default),
    )
}
