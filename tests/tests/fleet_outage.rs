//! The database restart as a non-event, in the Docker fleet: Postgres, two server replicas
//! and three agents in containers; Postgres is stopped for two minutes while every agent
//! runs jobs, some of which end during the outage. Then: no job requeued (attempts
//! unchanged), every result stored exactly once, every agent heard from within one
//! heartbeat interval of the database's return, and the servers answered 503 (never 500)
//! while it was away.
//!
//! Needs the images (`docker/build-images.sh`; `scripts/fleet-test.sh --prepare`).
//! `HEDDLE_OUTAGE_S` shortens the outage while iterating (default 120 s).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use heddle_e2e::fleet::{Fleet, docker, preflight, wait_for};
use heddle_testkit::Api;
use reqwest::Method;
use serde_json::{Value, json};

const ADMIN: &str = "hdl_fleet-admin-token-0000000000000000000000000000";
/// Heartbeats every 5 s: 7.5 s leases, so a 120 s outage outlasts a lease sixteen times.
const HEARTBEAT_S: u64 = 5;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const PG_ISREADY: &str = "/usr/lib/postgresql/15/bin/pg_isready";

struct Ctx {
    fleet: Fleet,
    /// The admin at no replica in particular: each call names one (`on`).
    api: Api,
}

impl Ctx {
    fn url(&self, server: &str) -> anyhow::Result<String> {
        Ok(format!("http://{}:8080", self.fleet.ip(server)?))
    }

    async fn get(&self, base: &str, path: &str) -> anyhow::Result<(u16, String)> {
        let (status, text) = self.api.on(base).try_call(Method::GET, path, None).await?;
        Ok((status.as_u16(), text))
    }

    async fn get_json(&self, base: &str, path: &str) -> anyhow::Result<Value> {
        let (status, body) = self.get(base, path).await?;
        ensure!((200..300).contains(&status), "GET {path}: {status}: {body}");
        Ok(serde_json::from_str(&body)?)
    }

    async fn post_json(&self, base: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        self.api
            .on(base)
            .try_ok(Method::POST, path, Some(body))
            .await
    }

    async fn start_sleep_run(&self, base: &str, seconds: u64) -> anyhow::Result<String> {
        let run = self
            .post_json(
                base,
                "/api/v1/runs",
                json!({"kind": "sleep", "params": {"seconds": seconds}, "nodes": NODES, "timeout_s": 600}),
            )
            .await?;
        Ok(run["id"].as_str().context("run without id")?.to_string())
    }

    /// `psql -tA` in the Postgres container.
    fn sql(&self, query: &str) -> anyhow::Result<String> {
        self.fleet.sql("pg", query)
    }

    fn pg_ready(&self) -> bool {
        self.fleet
            .exec(
                "pg",
                &[
                    PG_ISREADY,
                    "-h",
                    "127.0.0.1",
                    "-d",
                    "heddle",
                    "-U",
                    "postgres",
                ],
            )
            .is_ok()
    }
}

fn step(name: &str, since: Instant) {
    eprintln!(
        "fleet-outage: [{:>6.1} s] {name}",
        since.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_is_a_non_event() {
    if let Err(e) = preflight() {
        panic!("{e:#}");
    }
    let mut ctx = Ctx {
        fleet: Fleet::new().expect("docker network create"),
        api: Api {
            base: String::new(),
            token: ADMIN.into(),
            // Longer than the server's 5 s wait for a pooled connection.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()
                .unwrap(),
        },
    };
    if let Err(e) = scenario(&mut ctx).await {
        panic!("{e:#}\n\ncontainer logs:{}", ctx.fleet.all_logs());
    }
}

async fn scenario(ctx: &mut Ctx) -> anyhow::Result<()> {
    let outage = Duration::from_secs(
        std::env::var("HEDDLE_OUTAGE_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
    );
    let t0 = Instant::now();
    let servers = postgres_two_replicas_and_three_agents(ctx, t0).await?;
    let a = servers[0].clone();
    let runs = six_sleep_jobs_running(ctx, t0, &a, outage).await?;
    let down = every_answer_503_while_postgres_is_down(ctx, t0, &servers, &runs.1, outage).await?;
    let back = every_agent_heard_from_again(ctx, t0).await?;
    nothing_requeued_and_every_result_once(ctx, t0, &a, runs, outage, down, back).await
}

/// What the replicas answered while the database was down, and how long it was.
struct Down {
    answers: BTreeMap<u16, u32>,
    outage_len: Duration,
}

/// Returns the replicas' base URLs.
async fn postgres_two_replicas_and_three_agents(
    ctx: &mut Ctx,
    t0: Instant,
) -> anyhow::Result<[String; 2]> {
    ctx.fleet.run("pg", "heddle-postgres", &[], &[])?;
    wait_for("Postgres", Duration::from_secs(60), || async {
        Ok(ctx.pg_ready().then_some(()))
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
    let servers = [ctx.url("srv-a")?, ctx.url("srv-b")?];
    for url in &servers {
        wait_for(&format!("{url} ready"), Duration::from_secs(60), || async {
            Ok(ctx
                .get(url, "/readyz")
                .await
                .ok()
                .filter(|(s, _)| *s == 200))
        })
        .await?;
    }
    let a = servers[0].clone();
    let token = ctx
        .post_json(&a, "/api/v1/enrollment-tokens", json!({"max_uses": 3}))
        .await?;
    let token = token["token"].as_str().context("enrollment token")?;
    for node in NODES {
        let env = vec![
            (
                "HEDDLE_SERVER",
                "http://srv-a:8080,http://srv-b:8080".to_string(),
            ),
            ("HEDDLE_ENROLL_TOKEN", token.to_string()),
            ("HEDDLE_CLAIM_INTERVAL", "1s".to_string()),
            // Two jobs at once: one ends during the outage (its result waits in the spool),
            // one runs through it.
            ("HEDDLE_MAX_PARALLEL", "2".to_string()),
            ("HEDDLE_LOG", "info".to_string()),
        ];
        ctx.fleet
            .run(node, "heddle-agent", &env, &["--cap-add", "IPC_LOCK"])?;
    }
    wait_for(
        "three agents heartbeating",
        Duration::from_secs(60),
        || async {
            let n = ctx.sql(
            "SELECT count(*) FROM agents WHERE last_heartbeat_at > now() - interval '10 seconds'",
        )?;
            Ok((n == "3").then_some(()))
        },
    )
    .await?;
    step("Postgres, two replicas and three agents up", t0);
    Ok(servers)
}

/// Two sleep runs on every node: the short one ends during the outage, the long one runs
/// through it. Returns them.
async fn six_sleep_jobs_running(
    ctx: &Ctx,
    t0: Instant,
    a: &str,
    outage: Duration,
) -> anyhow::Result<(String, String)> {
    let outage_s = outage.as_secs();
    let short = ctx.start_sleep_run(a, outage_s / 3 + 10).await?;
    let long = ctx.start_sleep_run(a, outage_s + 45).await?;
    wait_for("six jobs running", Duration::from_secs(60), || async {
        let n = ctx.sql("SELECT count(*) FROM jobs WHERE state = 'running'")?;
        Ok((n == "6").then_some(()))
    })
    .await?;
    let attempts_before = ctx.sql("SELECT sum(attempts) FROM jobs")?;
    ensure!(attempts_before == "6", "attempts before: {attempts_before}");
    step("six sleep jobs running (three end during the outage)", t0);
    Ok((short, long))
}

/// The outage: a fast shutdown (STOPSIGNAL SIGINT), sessions get 57P01. Every answer of
/// both replicas is a 503 until Postgres is started again.
async fn every_answer_503_while_postgres_is_down(
    ctx: &Ctx,
    t0: Instant,
    servers: &[String; 2],
    long: &str,
    outage: Duration,
) -> anyhow::Result<Down> {
    docker(&["stop", "-t", "10", &ctx.fleet.name("pg")])?;
    let stopped = Instant::now();
    step("Postgres stopped", t0);
    let mut answers: BTreeMap<u16, u32> = BTreeMap::new();
    let mut unreachable_reasons = 0u32;
    let paths = [
        format!("/api/v1/runs/{long}"),
        "/api/v1/nodes".to_string(),
        "/readyz".to_string(),
    ];
    while stopped.elapsed() < outage {
        for base in servers {
            for path in &paths {
                if let Ok((status, body)) = ctx.get(base, path).await {
                    *answers.entry(status).or_default() += 1;
                    ensure!(
                        status == 503,
                        "GET {path} while Postgres is down: {status}: {body}"
                    );
                    if path == "/readyz" && body.starts_with("database unreachable since ") {
                        unreachable_reasons += 1;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    ensure!(unreachable_reasons > 0, "/readyz never said why");
    docker(&["start", &ctx.fleet.name("pg")])?;
    wait_for("Postgres back", Duration::from_secs(60), || async {
        Ok(ctx.pg_ready().then_some(()))
    })
    .await?;
    let outage_len = stopped.elapsed();
    step("Postgres started again", t0);
    Ok(Down {
        answers,
        outage_len,
    })
}

/// Each agent's first heartbeat after the database came back, against the moment the
/// postmaster started (both in the database's clock), in seconds.
async fn every_agent_heard_from_again(
    ctx: &Ctx,
    t0: Instant,
) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut back: BTreeMap<String, f64> = BTreeMap::new();
    let polling = Instant::now();
    while back.len() < NODES.len() {
        ensure!(
            polling.elapsed() < Duration::from_secs(60),
            "agents heard from after the return: {back:?}"
        );
        let rows = ctx.sql(
            "SELECT n.hostname, extract(epoch FROM a.last_heartbeat_at - pg_postmaster_start_time())
             FROM agents a JOIN nodes n ON n.id = a.node_id
             WHERE a.last_heartbeat_at > pg_postmaster_start_time()",
        );
        for line in rows.unwrap_or_default().lines() {
            if let Some((host, secs)) = line.split_once('|') {
                back.entry(host.to_string())
                    .or_insert_with(|| secs.parse().unwrap_or(f64::MAX));
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    step("every agent heartbeating again", t0);
    Ok(back)
}

/// Both runs end with no job requeued and each result stored once; every agent was back
/// within a heartbeat.
async fn nothing_requeued_and_every_result_once(
    ctx: &Ctx,
    t0: Instant,
    a: &str,
    (short, long): (String, String),
    outage: Duration,
    Down {
        answers,
        outage_len,
    }: Down,
    back: BTreeMap<String, f64>,
) -> anyhow::Result<()> {
    let outage_s = outage.as_secs();
    let slowest = back.values().cloned().fold(0.0, f64::max);
    for run in [&short, &long] {
        wait_for(
            &format!("run {run} finished"),
            Duration::from_secs(outage_s + 180),
            || async {
                let run = ctx.get_json(a, &format!("/api/v1/runs/{run}")).await?;
                let done = run["jobs"].as_array().is_some_and(|jobs| {
                    jobs.iter().all(|j| {
                        !matches!(j["state"].as_str(), Some("queued" | "leased" | "running"))
                    })
                });
                Ok(done.then_some(()))
            },
        )
        .await?;
    }
    let states = ctx.sql("SELECT state, count(*), sum(attempts) FROM jobs GROUP BY state")?;
    let requeued: i64 = ctx.sql("SELECT sum(attempts - 1) FROM jobs")?.parse()?;
    let results = ctx.sql("SELECT count(*), count(DISTINCT job_id) FROM results")?;
    eprintln!(
        "fleet-outage: outage {:.1} s; answers while down {answers:?}; requeued {requeued}; \
         jobs {states:?}; results (rows, jobs) {results}; agents back after {back:?} s \
         (slowest {slowest:.1} s, heartbeat {HEARTBEAT_S} s)",
        outage_len.as_secs_f64()
    );
    ensure!(
        answers.keys().all(|s| *s == 503),
        "answers while down: {answers:?}"
    );
    ensure!(requeued == 0, "{requeued} jobs requeued: {states}");
    ensure!(states == "succeeded|6|6", "job states: {states}");
    ensure!(results == "6|6", "results (rows, distinct jobs): {results}");
    ensure!(
        slowest <= HEARTBEAT_S as f64,
        "an agent came back {slowest:.1} s after the database (heartbeat {HEARTBEAT_S} s): {back:?}"
    );
    step(
        "0 requeued, 6 results once each, agents back within a heartbeat",
        t0,
    );
    Ok(())
}
