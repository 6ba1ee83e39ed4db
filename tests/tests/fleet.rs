//! The fleet test: Postgres, two server replicas on one database and three agents, each in
//! its own container on a private Docker network, then faults — an agent killed mid-run, an
//! agent cut off the network with a result pending, a replica restarted mid-upload, Postgres
//! restarted — and schemathesis feeding the API generated requests. After each fault every
//! result must be in Postgres exactly once.
//!
//! Needs the images (`docker/build-images.sh`) and schemathesis in ~/.cache/heddle-venv;
//! `scripts/fleet-test.sh --prepare` makes both. Missing either is a failure, not a skip.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use heddle_e2e::fleet::{Fleet, docker, preflight, wait_for};
use serde_json::{Value, json};

const ADMIN: &str = "hdl_fleet-admin-token-0000000000000000000000000000";
const HEARTBEAT_S: u64 = 2;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const STATE_DIR: &str = "/var/lib/heddle-agent";

struct Api {
    http: reqwest::Client,
}

impl Api {
    async fn get(&self, base: &str, path: &str) -> anyhow::Result<Value> {
        let r = self.http.get(format!("{base}{path}")).bearer_auth(ADMIN).send().await?;
        let status = r.status();
        let body = r.text().await?;
        ensure!(status.is_success(), "GET {path}: {status}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    async fn post(&self, base: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        let r = self.http.post(format!("{base}{path}")).bearer_auth(ADMIN).json(&body).send().await?;
        let status = r.status();
        let text = r.text().await?;
        ensure!(status.is_success(), "POST {path}: {status}: {text}");
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn start_run(&self, base: &str, kind: &str, params: Value, env: Value, nodes: &[&str]) -> anyhow::Result<String> {
        let run = self
            .post(base, "/api/v1/runs", json!({"kind": kind, "params": params, "env": env, "nodes": nodes, "timeout_s": 120}))
            .await?;
        Ok(run["id"].as_str().context("run without id")?.to_string())
    }

    async fn run(&self, base: &str, id: &str) -> anyhow::Result<Value> {
        self.get(base, &format!("/api/v1/runs/{id}")).await
    }

    /// Waits until every job of the run is in a terminal state and returns the run.
    async fn finished(&self, bases: &[String], id: &str, timeout: Duration) -> anyhow::Result<Value> {
        wait_for(&format!("run {id} to finish"), timeout, || async {
            // Whichever replica answers; the test itself rides out the faults it causes.
            for base in bases {
                if let Ok(run) = self.run(base, id).await {
                    let done = run["jobs"]
                        .as_array()
                        .is_some_and(|jobs| jobs.iter().all(|j| matches!(j["state"].as_str(), Some("succeeded" | "failed" | "cancelled" | "skipped"))));
                    return Ok(done.then_some(run));
                }
            }
            Ok(None)
        })
        .await
    }
}

struct Ctx {
    fleet: Fleet,
    api: Api,
}

impl Ctx {
    fn url(&self, server: &str) -> anyhow::Result<String> {
        Ok(format!("http://{}:8080", self.fleet.ip(server)?))
    }

    /// Base URLs of the replicas that currently have an address.
    fn urls(&self) -> Vec<String> {
        ["srv-a", "srv-b"].iter().filter_map(|s| self.url(s).ok()).collect()
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
        let r = self.api.get(base, &format!("/api/v1/runs/{id}/results")).await?;
        Ok(r.as_array().cloned().or_else(|| r["results"].as_array().cloned()).unwrap_or_default())
    }

    async fn job_state(&self, run_id: &str, host: &str) -> anyhow::Result<Value> {
        for base in self.urls() {
            if let Ok(run) = self.api.run(&base, run_id).await {
                let job = run["jobs"].as_array().unwrap().iter().find(|j| j["hostname"] == host).cloned();
                return job.context("no job for host");
            }
        }
        bail!("no replica answered")
    }

    fn spool_entries(&self, node: &str) -> anyhow::Result<usize> {
        let ls = self.fleet.exec(node, &["sh", "-c", &format!("ls {STATE_DIR}/spool/ | grep -c '\\.json$' || true")])?;
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
    let venv = std::env::var("HEDDLE_VENV").unwrap_or_else(|_| format!("{}/.cache/heddle-venv", std::env::var("HOME").unwrap()));
    let schemathesis = format!("{venv}/bin/schemathesis");
    assert!(std::path::Path::new(&schemathesis).exists(), "{schemathesis} is missing; run: scripts/fleet-test.sh --prepare");

    let fleet = Fleet::new().expect("docker network create");
    let mut ctx = Ctx { fleet, api: Api { http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap() } };
    let result = scenario(&mut ctx, &schemathesis).await;
    if let Err(e) = result {
        panic!("{e:#}\n\ncontainer logs:{}", ctx.fleet.all_logs());
    }
}

async fn scenario(ctx: &mut Ctx, schemathesis: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    ctx.fleet.run("pg", "heddle-postgres", &[], &[])?;
    wait_for("Postgres", Duration::from_secs(60), || async {
        Ok(ctx.fleet.exec("pg", &["/usr/lib/postgresql/15/bin/pg_isready", "-h", "127.0.0.1", "-d", "heddle", "-U", "postgres"]).ok())
    })
    .await?;
    let server_env = vec![
        ("HEDDLE_DATABASE_URL", "postgres://postgres@pg:5432/heddle".to_string()),
        ("HEDDLE_ADMIN_TOKEN", ADMIN.to_string()),
        ("HEDDLE_HEARTBEAT_INTERVAL_S", HEARTBEAT_S.to_string()),
        ("HEDDLE_LOG_JSON", "false".to_string()),
    ];
    ctx.fleet.run("srv-a", "heddle-server", &server_env, &[])?;
    ctx.fleet.run("srv-b", "heddle-server", &server_env, &[])?;
    for s in ["srv-a", "srv-b"] {
        let url = ctx.url(s)?;
        wait_for(&format!("{s} ready"), Duration::from_secs(60), || async {
            Ok(ctx.api.http.get(format!("{url}/readyz")).send().await.ok().filter(|r| r.status().is_success()))
        })
        .await?;
    }
    step("Postgres and two replicas ready", t0);
    let a = ctx.url("srv-a")?;
    let b = ctx.url("srv-b")?;

    // Enrollment: one token, three agents; each agent knows both replicas.
    let token = ctx.api.post(&a, "/api/v1/enrollment-tokens", json!({"max_uses": 3})).await?;
    let token = token["token"].as_str().context("enrollment token")?.to_string();
    for node in NODES {
        let env = vec![
            ("HEDDLE_SERVER", "http://srv-a:8080,http://srv-b:8080".to_string()),
            ("HEDDLE_ENROLL_TOKEN", token.clone()),
            ("HEDDLE_CLAIM_INTERVAL", "1s".to_string()),
            ("HEDDLE_BACKOFF_CAP", "2s".to_string()),
            ("HEDDLE_LOG", "info".to_string()),
        ];
        ctx.fleet.run(node, "heddle-agent", &env, &["--cap-add", "IPC_LOCK"])?;
    }
    let nodes: Vec<Value> = wait_for("three nodes online with facts", Duration::from_secs(60), || async {
        let list = ctx.api.get(&b, "/api/v1/nodes").await?;
        let list = list.as_array().cloned().or_else(|| list["nodes"].as_array().cloned()).unwrap_or_default();
        let ready: Vec<Value> = list.into_iter().filter(|n| n["health"] == "online" && !n["facts_updated_at"].is_null()).collect();
        Ok((ready.len() == NODES.len()).then_some(ready))
    })
    .await?;
    let mut hosts: Vec<&str> = nodes.iter().map(|n| n["hostname"].as_str().unwrap()).collect();
    hosts.sort();
    ensure!(hosts == NODES, "nodes {hosts:?}");
    for n in &nodes {
        let detail = ctx.api.get(&a, &format!("/api/v1/nodes/{}", n["id"].as_str().unwrap())).await?;
        let facts = &detail["facts"];
        ensure!(facts["host"]["hostname"] == n["hostname"], "facts of {} name another host: {}", n["hostname"], facts["host"]);
    }
    let agents = ctx.fleet.sql("pg", "SELECT count(*) FROM agents WHERE revoked_at IS NULL")?;
    ensure!(agents == "3", "{agents} active agents in Postgres");
    step("three agents enrolled, facts stored", t0);

    // A UCX perftest between two containers over TCP, when the agent has the `ucx` kind;
    // memcpy on every node otherwise (said out loud).
    let ucx = ctx
        .api
        .start_run(&a, "ucx", json!({}), json!({"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}), &["node-1", "node-2"])
        .await?;
    let run = ctx.api.finished(&ctx.urls(), &ucx, Duration::from_secs(90)).await?;
    ctx.assert_results_once(&run)?;
    let unsupported = |run: &Value| run["jobs"].as_array().unwrap().iter().any(|j| j["state"] == "skipped");
    if unsupported(&run) && ctx.results(&a, &ucx).await?.iter().any(|r| r["reason"].as_str().is_some_and(|s| s.starts_with("unsupported job kind"))) {
        eprintln!("fleet: NOTE: this agent has no `ucx` job kind; running memcpy on every node instead");
        let id = ctx.api.start_run(&a, "memcpy", json!({"max_bytes": 1 << 20, "iters": 5}), json!({}), &NODES).await?;
        let run = ctx.api.finished(&ctx.urls(), &id, Duration::from_secs(60)).await?;
        ctx.assert_results_once(&run)?;
        for j in run["jobs"].as_array().unwrap() {
            ensure!(j["state"] == "succeeded", "memcpy job: {j}");
        }
        let results = ctx.results(&a, &id).await?;
        ensure!(results.len() == 3 && results.iter().all(|r| r["rows"].as_array().is_some_and(|rows| rows.len() >= 5)), "memcpy results: {results:?}");
        step("memcpy on three nodes (no ucx kind)", t0);
    } else {
        for j in run["jobs"].as_array().unwrap() {
            ensure!(j["state"] == "succeeded", "ucx job over TCP did not succeed: {j}");
        }
        let results = ctx.results(&a, &ucx).await?;
        ensure!(results.iter().any(|r| r["rows"].as_array().is_some_and(|rows| !rows.is_empty())), "ucx run without rows: {results:?}");
        step("ucx perftest over TCP between node-1 and node-2", t0);
    }

    // RDMA on containers without an HCA: skipped with the reason.
    let rdma = ctx.api.start_run(&a, "rdma", json!({}), json!({}), &["node-1", "node-2"]).await?;
    let run = ctx.api.finished(&ctx.urls(), &rdma, Duration::from_secs(60)).await?;
    ctx.assert_results_once(&run)?;
    let reasons: Vec<String> = ctx.results(&a, &rdma).await?.iter().map(|r| r["reason"].as_str().unwrap_or("").to_string()).collect();
    if reasons.iter().all(|r| r.starts_with("unsupported job kind")) {
        eprintln!("fleet: NOTE: this agent has no `rdma` job kind; checked that the job is skipped as unsupported");
        ensure!(run["jobs"].as_array().unwrap().iter().all(|j| j["state"] == "skipped"), "{run}");
    } else {
        ensure!(run["jobs"].as_array().unwrap().iter().all(|j| j["state"] == "skipped"), "rdma without a device: {run}");
        ensure!(reasons.iter().all(|r| r.to_lowercase().contains("no rdma device")), "rdma skip reasons: {reasons:?}");
        step("rdma skipped: no RDMA device", t0);
    }

    // A first-party plugin, uploaded and enabled through the API, has an outcome per node.
    let wasm = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../plugins/dist/runai-roce.wasm")).context("plugins/dist/runai-roce.wasm (scripts/build-plugins.sh)")?;
    let r = ctx.api.http.post(format!("{a}/api/v1/plugins/runai-roce/versions/1.0.0")).bearer_auth(ADMIN).header("content-type", "application/wasm").body(wasm).send().await?;
    ensure!(r.status().is_success(), "plugin upload: {} {}", r.status(), r.text().await?);
    ctx.api.post(&b, "/api/v1/plugins/runai-roce/enable", json!({"version": "1.0.0"})).await?;
    for n in &nodes {
        let id = n["id"].as_str().unwrap();
        let outcome = wait_for(&format!("runai-roce outcome on {}", n["hostname"]), Duration::from_secs(60), || async {
            let list = ctx.api.get(&a, &format!("/api/v1/nodes/{id}/plugins")).await?;
            let list = list.as_array().cloned().unwrap_or_default();
            Ok(list.into_iter().find(|o| o["plugin"] == "runai-roce"))
        })
        .await?;
        ensure!(outcome["error"].is_null() && outcome["output"].is_object(), "runai-roce on {}: {outcome}", n["hostname"]);
    }
    step("runai-roce plugin outcome on every node", t0);

    // Fault 1: an agent killed during a sleep run; the lease lapses and the job is requeued
    // (or failed with a reason) within two heartbeat intervals, then runs to one result.
    let run_id = ctx.api.start_run(&a, "sleep", json!({"seconds": 6}), json!({}), &["node-3"]).await?;
    wait_for("sleep running on node-3", Duration::from_secs(30), || async {
        Ok(ctx.job_state(&run_id, "node-3").await.ok().filter(|j| j["state"] == "running"))
    })
    .await?;
    docker(&["kill", &ctx.fleet.name("node-3")])?;
    let killed = Instant::now();
    let job = wait_for("the killed agent's job to be requeued or failed", Duration::from_secs(4 * HEARTBEAT_S + 10), || async {
        Ok(ctx.job_state(&run_id, "node-3").await.ok().filter(|j| j["state"] == "queued" || j["state"] == "failed"))
    })
    .await?;
    let noticed = killed.elapsed();
    // The lease is 2 intervals from its last renewal; the reaper ticks every quarter interval.
    ensure!(noticed <= Duration::from_secs(2 * HEARTBEAT_S) + Duration::from_millis(1500), "requeued after {noticed:?}: {job}");
    ensure!(job["state"] == "queued" || job["error"].as_str().is_some_and(|e| !e.is_empty()), "failed without a reason: {job}");
    eprintln!("fleet: killed agent's job {} after {:.1} s", job["state"], noticed.as_secs_f64());
    docker(&["start", &ctx.fleet.name("node-3")])?;
    let run = ctx.api.finished(&ctx.urls(), &run_id, Duration::from_secs(60)).await?;
    ctx.assert_results_once(&run)?;
    let job = &run["jobs"][0];
    ensure!(job["state"] == "succeeded" && job["attempts"].as_i64() >= Some(2), "after restart: {job}");
    step("fault: agent killed mid-run, requeued, rerun, one result", t0);

    // Fault 2: an agent cut off the network while its job finishes: the result waits in the
    // spool, and after reconnection is uploaded once.
    let run_id = ctx.api.start_run(&a, "sleep", json!({"seconds": 2}), json!({}), &["node-2"]).await?;
    wait_for("sleep running on node-2", Duration::from_secs(30), || async {
        Ok(ctx.job_state(&run_id, "node-2").await.ok().filter(|j| j["state"] == "running"))
    })
    .await?;
    docker(&["network", "disconnect", &ctx.fleet.network, &ctx.fleet.name("node-2")])?;
    wait_for("the result in node-2's spool", Duration::from_secs(20), || async { Ok((ctx.spool_entries("node-2")? >= 1).then_some(())) }).await?;
    let stored = ctx.fleet.sql("pg", &format!("SELECT count(*) FROM results r JOIN jobs j ON j.id = r.job_id WHERE j.run_id = '{run_id}'"))?;
    ensure!(stored == "0", "a result arrived from a disconnected agent");
    tokio::time::sleep(Duration::from_secs(2)).await;
    docker(&["network", "connect", "--alias", "node-2", &ctx.fleet.network, &ctx.fleet.name("node-2")])?;
    let run = ctx.api.finished(&ctx.urls(), &run_id, Duration::from_secs(60)).await?;
    ctx.assert_results_once(&run)?;
    ensure!(run["jobs"][0]["state"] == "succeeded", "{run}");
    wait_for("node-2's spool to drain", Duration::from_secs(30), || async { Ok((ctx.spool_entries("node-2")? == 0).then_some(())) }).await?;
    step("fault: agent disconnected with a pending result, spooled, uploaded once", t0);

    // Fault 3: replica A restarted while results are uploaded; B keeps serving.
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(ctx.api.start_run(&b, "memcpy", json!({"max_bytes": 1 << 20, "iters": 3}), json!({}), &NODES).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    docker(&["stop", "-t", "0", &ctx.fleet.name("srv-a")])?;
    let ready_b = ctx.api.http.get(format!("{b}/readyz")).send().await?.status();
    ensure!(ready_b.is_success(), "srv-b not ready while srv-a is down: {ready_b}");
    ctx.api.get(&b, "/api/v1/runs").await.context("srv-b serving while srv-a is down")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    docker(&["start", &ctx.fleet.name("srv-a")])?;
    for id in &runs {
        let run = ctx.api.finished(&ctx.urls(), id, Duration::from_secs(90)).await?;
        ctx.assert_results_once(&run)?;
        ensure!(run["jobs"].as_array().unwrap().iter().all(|j| j["state"] == "succeeded"), "{run}");
    }
    let a = ctx.url("srv-a")?;
    wait_for("srv-a ready again", Duration::from_secs(30), || async {
        Ok(ctx.api.http.get(format!("{a}/readyz")).send().await.ok().filter(|r| r.status().is_success()))
    })
    .await?;
    step("fault: replica restarted mid-upload, 12 results once each", t0);

    // Fault 4: Postgres restarted under running work.
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(ctx.api.start_run(&a, "memcpy", json!({"max_bytes": 1 << 20, "iters": 3}), json!({}), &NODES).await?);
    }
    runs.push(ctx.api.start_run(&a, "sleep", json!({"seconds": 3}), json!({}), &["node-1"]).await?);
    docker(&["restart", "-t", "2", &ctx.fleet.name("pg")])?;
    for s in ["srv-a", "srv-b"] {
        let url = ctx.url(s)?;
        wait_for(&format!("{s} ready after the Postgres restart"), Duration::from_secs(60), || async {
            Ok(ctx.api.http.get(format!("{url}/readyz")).send().await.ok().filter(|r| r.status().is_success()))
        })
        .await?;
    }
    for id in &runs {
        let run = ctx.api.finished(&ctx.urls(), id, Duration::from_secs(90)).await?;
        ctx.assert_results_once(&run)?;
        ensure!(run["jobs"].as_array().unwrap().iter().all(|j| j["state"] == "succeeded"), "{run}");
    }
    step("fault: Postgres restarted, every result once", t0);

    // Garbage: schemathesis against the served OpenAPI document; no 5xx.
    let out = tokio::process::Command::new("timeout")
        .args(["240", schemathesis, "run", &format!("{a}/api/v1/openapi.json"), "--checks", "not_a_server_error", "--hypothesis-max-examples", "12"])
        .args(["--hypothesis-deadline", "10000", "--request-timeout", "10000", "--hypothesis-derandomize", "--workers", "2"])
        .args(["-H", &format!("Authorization: Bearer {ADMIN}"), "--no-color", "--experimental=openapi-3.1"])
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .await
        .context("running schemathesis")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let tail: String = text.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    ensure!(out.status.code() != Some(124), "schemathesis ran past 240 s:\n{tail}");
    ensure!(out.status.success(), "schemathesis found failures:\n{text}");
    eprintln!("{tail}");
    step("schemathesis: no 5xx", t0);
    ensure!(t0.elapsed() < Duration::from_secs(300), "the fleet test took {:?}, over its 5-minute budget", t0.elapsed());
    Ok(())
}
