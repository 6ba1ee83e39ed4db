//! The fleet test: Postgres, two server replicas on one database and three agents, each in
//! its own container on a private Docker network, then faults — an agent killed mid-run, an
//! agent cut off the network with a result pending, a replica restarted mid-upload, Postgres
//! restarted — and schemathesis feeding the API generated requests. After each fault every
//! result must be in Postgres exactly once. Each is a named step of `scenario`; the faults
//! are in `fleet/faults.rs`, schemathesis in `fleet/schemathesis.rs`.
//!
//! Needs the images (`docker/build-images.sh`) and schemathesis in ~/.cache/heddle-venv;
//! `scripts/fleet-test.sh --prepare` makes both. Missing either is a failure, not a skip.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use heddle_e2e::fleet::{Fleet, docker, preflight, wait_for};
use heddle_testkit::Api;
use reqwest::Method;
use serde_json::{Value, json};

#[path = "fleet/faults.rs"]
mod faults;
#[path = "fleet/schemathesis.rs"]
mod schemathesis;

use faults::*;
use schemathesis::schemathesis_finds_no_server_error;

const ADMIN: &str = "hdl_fleet-admin-token-0000000000000000000000000000";
const HEARTBEAT_S: u64 = 2;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const STATE_DIR: &str = "/var/lib/heddle-agent";

struct Ctx {
    fleet: Fleet,
    /// The admin at no replica in particular: each call names one (`on`).
    api: Api,
}

impl Ctx {
    async fn get(&self, base: &str, path: &str) -> anyhow::Result<Value> {
        self.api.on(base).try_ok(Method::GET, path, None).await
    }

    async fn post(&self, base: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        self.api
            .on(base)
            .try_ok(Method::POST, path, Some(body))
            .await
    }

    async fn start_run(
        &self,
        base: &str,
        kind: &str,
        params: Value,
        env: Value,
        nodes: &[&str],
    ) -> anyhow::Result<String> {
        let run = self
            .post(base, "/api/v1/runs", json!({"kind": kind, "params": params, "env": env, "nodes": nodes, "timeout_s": 120}))
            .await?;
        Ok(run["id"].as_str().context("run without id")?.to_string())
    }

    async fn run(&self, base: &str, id: &str) -> anyhow::Result<Value> {
        self.get(base, &format!("/api/v1/runs/{id}")).await
    }

    /// Waits until every job of the run is in a terminal state and returns the run.
    async fn finished(
        &self,
        bases: &[String],
        id: &str,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        wait_for(&format!("run {id} to finish"), timeout, || async {
            // Whichever replica answers; the test itself rides out the faults it causes.
            for base in bases {
                if let Ok(run) = self.run(base, id).await {
                    let done = run["jobs"].as_array().is_some_and(|jobs| {
                        jobs.iter().all(|j| {
                            matches!(
                                j["state"].as_str(),
                                Some("succeeded" | "failed" | "cancelled" | "skipped")
                            )
                        })
                    });
                    return Ok(done.then_some(run));
                }
            }
            Ok(None)
        })
        .await
    }

    fn url(&self, server: &str) -> anyhow::Result<String> {
        Ok(format!("http://{}:8080", self.fleet.ip(server)?))
    }

    /// Base URLs of the replicas that currently have an address.
    fn urls(&self) -> Vec<String> {
        ["srv-a", "srv-b"]
            .iter()
            .filter_map(|s| self.url(s).ok())
            .collect()
    }

    /// Every job that ended `succeeded` or `skipped` has exactly one row in `results`; no
    /// job has more than one (a failed or cancelled job has one when its agent reported it,
    /// none when the server ended it).
    fn assert_results_once(&self, run: &Value) -> anyhow::Result<()> {
        let id = run["id"].as_str().unwrap();
        let counts = self.fleet.sql("pg", &format!("SELECT job_id, count(*) FROM results WHERE job_id IN (SELECT id FROM jobs WHERE run_id = '{id}') GROUP BY job_id"))?;
        let counts: BTreeMap<String, u32> = counts
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(j, c)| (j.to_string(), c.parse().unwrap()))
            .collect();
        for job in run["jobs"].as_array().unwrap() {
            let jid = job["id"].as_str().unwrap();
            let state = job["state"].as_str().unwrap();
            let got = counts.get(jid).copied().unwrap_or(0);
            let ok = match state {
                "succeeded" | "skipped" => got == 1,
                _ => got <= 1,
            };
            ensure!(ok, "job {jid} ({state}) has {got} results: {job}");
        }
        Ok(())
    }

    async fn results(&self, base: &str, id: &str) -> anyhow::Result<Vec<Value>> {
        let r = self
            .get(base, &format!("/api/v1/runs/{id}/results"))
            .await?;
        Ok(r.as_array()
            .cloned()
            .or_else(|| r["results"].as_array().cloned())
            .unwrap_or_default())
    }

    async fn job_state(&self, run_id: &str, host: &str) -> anyhow::Result<Value> {
        for base in self.urls() {
            if let Ok(run) = self.run(&base, run_id).await {
                let job = run["jobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|j| j["hostname"] == host)
                    .cloned();
                return job.context("no job for host");
            }
        }
        bail!("no replica answered")
    }

    /// Waits until `host`'s job of the run is in one of `states`, and returns it.
    async fn job_in(
        &self,
        run_id: &str,
        host: &str,
        states: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let what = format!("{host}'s job of run {run_id} to be {}", states.join(" or "));
        wait_for(&what, timeout, || async {
            Ok(self
                .job_state(run_id, host)
                .await
                .ok()
                .filter(|j| states.iter().any(|s| j["state"] == *s)))
        })
        .await
    }

    /// Waits until replica `server` is ready (`/readyz`), and returns its base URL.
    async fn ready(&self, server: &str, timeout: Duration) -> anyhow::Result<String> {
        let url = self.url(server)?;
        wait_for(&format!("{server} ready"), timeout, || async {
            Ok(self
                .api
                .http
                .get(format!("{url}/readyz"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success()))
        })
        .await?;
        Ok(url)
    }

    /// Starts `n` small memcpy runs on every node through `base`.
    async fn memcpy_runs(&self, base: &str, n: usize) -> anyhow::Result<Vec<String>> {
        let mut runs = Vec::new();
        for _ in 0..n {
            let params = json!({"max_bytes": 1 << 20, "iters": 3});
            runs.push(
                self.start_run(base, "memcpy", params, json!({}), &NODES)
                    .await?,
            );
        }
        Ok(runs)
    }

    /// Waits for each run to finish with every job succeeded and every result stored once.
    async fn all_succeed_once(&self, runs: &[String], timeout: Duration) -> anyhow::Result<()> {
        for id in runs {
            let run = self.finished(&self.urls(), id, timeout).await?;
            self.assert_results_once(&run)?;
            let jobs = run["jobs"].as_array().context("run without jobs")?;
            ensure!(jobs.iter().all(|j| j["state"] == "succeeded"), "{run}");
        }
        Ok(())
    }

    fn spool_entries(&self, node: &str) -> anyhow::Result<usize> {
        let ls = self.fleet.exec(
            node,
            &[
                "sh",
                "-c",
                &format!("ls {STATE_DIR}/spool/ | grep -c '\\.json$' || true"),
            ],
        )?;
        Ok(ls.trim().parse().unwrap_or(0))
    }
}

fn step(name: &str, since: Instant) {
    eprintln!("fleet: [{:>6.1} s] {name}", since.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet() {
    if let Err(e) = preflight() {
        panic!("{e:#}");
    }
    let venv = std::env::var("HEDDLE_VENV")
        .unwrap_or_else(|_| format!("{}/.cache/heddle-venv", std::env::var("HOME").unwrap()));
    let schemathesis = format!("{venv}/bin/schemathesis");
    assert!(
        std::path::Path::new(&schemathesis).exists(),
        "{schemathesis} is missing; run: scripts/fleet-test.sh --prepare"
    );

    let fleet = Fleet::new().expect("docker network create");
    let mut ctx = Ctx {
        fleet,
        api: Api {
            base: String::new(),
            token: ADMIN.into(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        },
    };
    let result = scenario(&mut ctx, &schemathesis).await;
    if let Err(e) = result {
        panic!("{e:#}\n\ncontainer logs:{}", ctx.fleet.all_logs());
    }
}

/// What the scenario's steps share: the fleet, the clock the steps are timed by, and the
/// replicas' base URLs (A's changes when it restarts).
struct Scenario<'c> {
    ctx: &'c Ctx,
    t0: Instant,
    a: String,
    b: String,
}

/// The steps in order; each leaves the fleet as the next expects it.
async fn scenario(ctx: &mut Ctx, schemathesis: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let (a, b) = start_postgres_and_two_replicas(ctx, t0).await?;
    let nodes = enroll_three_agents(ctx, t0, &a, &b).await?;
    let mut s = Scenario { ctx, t0, a, b };
    memcpy_on_every_node(&s).await?;
    ucx_over_tcp(&s).await?;
    rdma_skipped_without_a_device(&s).await?;
    plugin_outcome_on_every_node(&s, &nodes).await?;
    fault_agent_killed_mid_run(&s).await?;
    fault_agent_disconnected_with_a_pending_result(&s).await?;
    s.a = fault_replica_restarted_mid_upload(&s).await?;
    fault_postgres_restarted(&s).await?;
    schemathesis_finds_no_server_error(&s, schemathesis).await?;
    ensure!(
        t0.elapsed() < Duration::from_secs(300),
        "the fleet test took {:?}, over its 5-minute budget",
        t0.elapsed()
    );
    Ok(())
}

/// Returns replica A's and B's base URLs.
async fn start_postgres_and_two_replicas(
    ctx: &mut Ctx,
    t0: Instant,
) -> anyhow::Result<(String, String)> {
    ctx.fleet.run("pg", "heddle-postgres", &[], &[])?;
    wait_for("Postgres", Duration::from_secs(60), || async {
        Ok(ctx
            .fleet
            .exec(
                "pg",
                &[
                    "/usr/lib/postgresql/15/bin/pg_isready",
                    "-h",
                    "127.0.0.1",
                    "-d",
                    "heddle",
                    "-U",
                    "postgres",
                ],
            )
            .ok())
    })
    .await?;
    let server_env = vec![
        (
            "HEDDLE_DATABASE_URL",
            "postgres://postgres@pg:5432/heddle".to_string(),
        ),
        ("HEDDLE_ADMIN_TOKEN", ADMIN.to_string()),
        ("HEDDLE_HEARTBEAT_INTERVAL_S", HEARTBEAT_S.to_string()),
        ("HEDDLE_LOG_JSON", "false".to_string()),
    ];
    ctx.fleet.run("srv-a", "heddle-server", &server_env, &[])?;
    ctx.fleet.run("srv-b", "heddle-server", &server_env, &[])?;
    for s in ["srv-a", "srv-b"] {
        ctx.ready(s, Duration::from_secs(60)).await?;
    }
    step("Postgres and two replicas ready", t0);
    let a = ctx.url("srv-a")?;
    let b = ctx.url("srv-b")?;
    Ok((a, b))
}

/// Enrollment: one token, three agents; each agent knows both replicas. Returns the nodes.
async fn enroll_three_agents(
    ctx: &mut Ctx,
    t0: Instant,
    a: &str,
    b: &str,
) -> anyhow::Result<Vec<Value>> {
    let token = ctx
        .post(a, "/api/v1/enrollment-tokens", json!({"max_uses": 3}))
        .await?;
    let token = token["token"]
        .as_str()
        .context("enrollment token")?
        .to_string();
    for node in NODES {
        let env = vec![
            (
                "HEDDLE_SERVER",
                "http://srv-a:8080,http://srv-b:8080".to_string(),
            ),
            ("HEDDLE_ENROLL_TOKEN", token.clone()),
            ("HEDDLE_CLAIM_INTERVAL", "1s".to_string()),
            ("HEDDLE_BACKOFF_CAP", "2s".to_string()),
            ("HEDDLE_LOG", "info".to_string()),
        ];
        ctx.fleet
            .run(node, "heddle-agent", &env, &["--cap-add", "IPC_LOCK"])?;
    }
    let nodes: Vec<Value> = wait_for(
        "three nodes online with facts",
        Duration::from_secs(60),
        || async {
            let list = ctx.get(b, "/api/v1/nodes").await?;
            let list = list
                .as_array()
                .cloned()
                .or_else(|| list["nodes"].as_array().cloned())
                .unwrap_or_default();
            let ready: Vec<Value> = list
                .into_iter()
                .filter(|n| n["health"] == "online" && !n["facts_updated_at"].is_null())
                .collect();
            Ok((ready.len() == NODES.len()).then_some(ready))
        },
    )
    .await?;
    let mut hosts: Vec<&str> = nodes
        .iter()
        .map(|n| n["hostname"].as_str().unwrap())
        .collect();
    hosts.sort();
    ensure!(hosts == NODES, "nodes {hosts:?}");
    for n in &nodes {
        let detail = ctx
            .get(a, &format!("/api/v1/nodes/{}", n["id"].as_str().unwrap()))
            .await?;
        let facts = &detail["facts"];
        ensure!(
            facts["host"]["hostname"] == n["hostname"],
            "facts of {} name another host: {}",
            n["hostname"],
            facts["host"]
        );
    }
    let agents = ctx
        .fleet
        .sql("pg", "SELECT count(*) FROM agents WHERE revoked_at IS NULL")?;
    ensure!(agents == "3", "{agents} active agents in Postgres");
    step("three agents enrolled, facts stored", t0);
    Ok(nodes)
}

/// memcpy on every node: three results with their rows.
async fn memcpy_on_every_node(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, t0, a) = (s.ctx, s.t0, &s.a);
    let id = ctx
        .start_run(
            a,
            "memcpy",
            json!({"max_bytes": 1 << 20, "iters": 5}),
            json!({}),
            &NODES,
        )
        .await?;
    let run = ctx
        .finished(&ctx.urls(), &id, Duration::from_secs(60))
        .await?;
    ctx.assert_results_once(&run)?;
    for j in run["jobs"].as_array().unwrap() {
        ensure!(j["state"] == "succeeded", "memcpy job: {j}");
    }
    let results = ctx.results(a, &id).await?;
    ensure!(
        results.len() == 3
            && results
                .iter()
                .all(|r| r["rows"].as_array().is_some_and(|rows| rows.len() >= 5)),
        "memcpy results: {results:?}"
    );
    step("memcpy on three nodes", t0);
    Ok(())
}

/// A UCX perftest between two containers over TCP (rank 0 serves, rank 1 connects; the
/// address goes through the server's rendezvous).
async fn ucx_over_tcp(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, t0, a) = (s.ctx, s.t0, &s.a);
    let ucx = ctx
        .start_run(
            a,
            "ucx",
            json!({"iters": 1000, "warmup": 100}),
            json!({"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}),
            &["node-1", "node-2"],
        )
        .await?;
    let run = ctx
        .finished(&ctx.urls(), &ucx, Duration::from_secs(90))
        .await?;
    ctx.assert_results_once(&run)?;
    for j in run["jobs"].as_array().unwrap() {
        ensure!(
            j["state"] == "succeeded",
            "ucx job over TCP did not succeed: {j}"
        );
    }
    let results = ctx.results(a, &ucx).await?;
    ensure!(
        results
            .iter()
            .any(|r| r["rows"].as_array().is_some_and(|rows| !rows.is_empty())),
        "ucx run without rows: {results:?}"
    );
    step("ucx perftest over TCP between node-1 and node-2", t0);
    Ok(())
}

/// RDMA on containers without an HCA: skipped, saying so.
async fn rdma_skipped_without_a_device(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, t0, a) = (s.ctx, s.t0, &s.a);
    let rdma = ctx
        .start_run(a, "rdma", json!({}), json!({}), &["node-1", "node-2"])
        .await?;
    let run = ctx
        .finished(&ctx.urls(), &rdma, Duration::from_secs(60))
        .await?;
    ctx.assert_results_once(&run)?;
    ensure!(
        run["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] == "skipped"),
        "rdma without a device: {run}"
    );
    let reasons: Vec<String> = ctx
        .results(a, &rdma)
        .await?
        .iter()
        .map(|r| r["reason"].as_str().unwrap_or("").to_string())
        .collect();
    ensure!(
        reasons.len() == 2 && reasons.iter().all(|r| r.starts_with("no RDMA device")),
        "rdma skip reasons: {reasons:?}"
    );
    step("rdma skipped: no RDMA device", t0);
    Ok(())
}

/// A first-party plugin, uploaded and enabled through the API, has an outcome per node.
async fn plugin_outcome_on_every_node(s: &Scenario<'_>, nodes: &[Value]) -> anyhow::Result<()> {
    let (ctx, t0, a, b) = (s.ctx, s.t0, &s.a, &s.b);
    let wasm = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../plugins/dist/runai-roce.wasm"
    ))
    .context("plugins/dist/runai-roce.wasm (scripts/build-plugins.sh)")?;
    let r = ctx
        .api
        .http
        .post(format!("{a}/api/v1/plugins/runai-roce/versions/1.0.0"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/wasm")
        .body(wasm)
        .send()
        .await?;
    ensure!(
        r.status().is_success(),
        "plugin upload: {} {}",
        r.status(),
        r.text().await?
    );
    ctx.post(
        b,
        "/api/v1/plugins/runai-roce/enable",
        json!({"version": "1.0.0"}),
    )
    .await?;
    for n in nodes {
        let id = n["id"].as_str().unwrap();
        let outcome = wait_for(
            &format!("runai-roce outcome on {}", n["hostname"]),
            Duration::from_secs(60),
            || async {
                let list = ctx.get(a, &format!("/api/v1/nodes/{id}/plugins")).await?;
                let list = list.as_array().cloned().unwrap_or_default();
                Ok(list.into_iter().find(|o| o["plugin"] == "runai-roce"))
            },
        )
        .await?;
        ensure!(
            outcome["error"].is_null() && outcome["output"].is_object(),
            "runai-roce on {}: {outcome}",
            n["hostname"]
        );
    }
    step("runai-roce plugin outcome on every node", t0);
    Ok(())
}
