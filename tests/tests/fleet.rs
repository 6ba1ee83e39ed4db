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
use heddle_e2e::fleet::{docker, preflight, wait_for};
use heddle_e2e::fleet_ops::{ADMIN, Cluster, REPLICAS, STATE_DIR};
use serde_json::{Value, json};

#[path = "fleet/faults.rs"]
mod faults;
#[path = "fleet/schemathesis.rs"]
mod schemathesis;

use faults::*;
use schemathesis::schemathesis_finds_no_server_error;

const HEARTBEAT_S: u64 = 2;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];

/// The fleet test's cluster ([`Cluster`]: the fleet, the admin API, runs and replicas),
/// with what only this test asks of it.
struct Ctx(Cluster);

impl std::ops::Deref for Ctx {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl std::ops::DerefMut for Ctx {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.0
    }
}

impl Ctx {
    /// Starts a run of `kind` on `nodes` with `env` set for its jobs.
    async fn start_run_with_env(
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
            .get_json(base, &format!("/api/v1/runs/{id}/results"))
            .await?;
        Ok(r.as_array()
            .cloned()
            .or_else(|| r["results"].as_array().cloned())
            .unwrap_or_default())
    }

    async fn job_state(&self, run_id: &str, host: &str) -> anyhow::Result<Value> {
        for server in REPLICAS {
            let Ok(base) = self.url(server) else { continue };
            if let Ok(run) = self
                .get_json(&base, &format!("/api/v1/runs/{run_id}"))
                .await
            {
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

    /// Starts `n` small memcpy runs on every node through `base`.
    async fn memcpy_runs(&self, base: &str, n: usize) -> anyhow::Result<Vec<String>> {
        let mut runs = Vec::new();
        for _ in 0..n {
            let params = json!({"max_bytes": 1 << 20, "iters": 3});
            runs.push(
                self.start_run_with_env(base, "memcpy", params, json!({}), &NODES)
                    .await?,
            );
        }
        Ok(runs)
    }

    /// Waits for each run to finish with every job succeeded and every result stored once.
    async fn all_succeed_once(&self, runs: &[String], timeout: Duration) -> anyhow::Result<()> {
        for id in runs {
            let run = self.finished(id, timeout).await?;
            self.assert_results_once(&run)?;
            Cluster::ensure_succeeded(&run)?;
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

    let mut ctx = Ctx(Cluster::new("fleet").expect("docker network create"));
    let result = scenario(&mut ctx, &schemathesis).await;
    if let Err(e) = result {
        panic!("{e:#}\n\ncontainer logs:{}", ctx.fleet.all_logs());
    }
}

/// What the scenario's steps share: the cluster (which times the steps) and the replicas'
/// base URLs (A's changes when it restarts).
struct Scenario<'c> {
    ctx: &'c Ctx,
    a: String,
    b: String,
}

/// The steps in order; each leaves the fleet as the next expects it.
async fn scenario(ctx: &mut Ctx, schemathesis: &str) -> anyhow::Result<()> {
    let (a, b) = start_postgres_and_two_replicas(ctx).await?;
    let nodes = enroll_three_agents(ctx, &a, &b).await?;
    let mut s = Scenario { ctx, a, b };
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
        ctx.t0.elapsed() < Duration::from_secs(300),
        "the fleet test took {:?}, over its 5-minute budget",
        ctx.t0.elapsed()
    );
    Ok(())
}

/// Returns replica A's and B's base URLs.
async fn start_postgres_and_two_replicas(ctx: &mut Ctx) -> anyhow::Result<(String, String)> {
    ctx.fleet.run("pg", "heddle-postgres", &[], &[])?;
    ctx.wait_pg().await?;
    let server_env = Cluster::server_env(HEARTBEAT_S, &[]);
    ctx.fleet.run("srv-a", "heddle-server", &server_env, &[])?;
    ctx.fleet.run("srv-b", "heddle-server", &server_env, &[])?;
    for s in REPLICAS {
        ctx.wait_ready(s, Duration::from_secs(60)).await?;
    }
    ctx.step("Postgres and two replicas ready");
    let a = ctx.url("srv-a")?;
    let b = ctx.url("srv-b")?;
    Ok((a, b))
}

/// Enrollment: one token, three agents; each agent knows both replicas. Returns the nodes.
async fn enroll_three_agents(ctx: &mut Ctx, a: &str, b: &str) -> anyhow::Result<Vec<Value>> {
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
            let list = ctx.get_json(b, "/api/v1/nodes").await?;
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
            .get_json(a, &format!("/api/v1/nodes/{}", n["id"].as_str().unwrap()))
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
    ctx.step("three agents enrolled, facts stored");
    Ok(nodes)
}

/// memcpy on every node: three results with their rows.
async fn memcpy_on_every_node(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, a) = (s.ctx, &s.a);
    let id = ctx
        .start_run_with_env(
            a,
            "memcpy",
            json!({"max_bytes": 1 << 20, "iters": 5}),
            json!({}),
            &NODES,
        )
        .await?;
    let run = ctx.finished(&id, Duration::from_secs(60)).await?;
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
    ctx.step("memcpy on three nodes");
    Ok(())
}

/// A UCX perftest between two containers over TCP (rank 0 serves, rank 1 connects; the
/// address goes through the server's rendezvous).
async fn ucx_over_tcp(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, a) = (s.ctx, &s.a);
    let ucx = ctx
        .start_run_with_env(
            a,
            "ucx",
            json!({"iters": 1000, "warmup": 100}),
            json!({"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}),
            &["node-1", "node-2"],
        )
        .await?;
    let run = ctx.finished(&ucx, Duration::from_secs(90)).await?;
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
    ctx.step("ucx perftest over TCP between node-1 and node-2");
    Ok(())
}

/// RDMA on containers without an HCA: skipped, saying so.
async fn rdma_skipped_without_a_device(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, a) = (s.ctx, &s.a);
    let rdma = ctx
        .start_run_with_env(a, "rdma", json!({}), json!({}), &["node-1", "node-2"])
        .await?;
    let run = ctx.finished(&rdma, Duration::from_secs(60)).await?;
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
    ctx.step("rdma skipped: no RDMA device");
    Ok(())
}

/// A first-party plugin, uploaded and enabled through the API, has an outcome per node.
async fn plugin_outcome_on_every_node(s: &Scenario<'_>, nodes: &[Value]) -> anyhow::Result<()> {
    let (ctx, a, b) = (s.ctx, &s.a, &s.b);
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
                let list = ctx
                    .get_json(a, &format!("/api/v1/nodes/{id}/plugins"))
                    .await?;
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
    ctx.step("runai-roce plugin outcome on every node");
    Ok(())
}
