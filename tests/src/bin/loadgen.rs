//! Simulates a fleet of agents against real `heddle-server` processes on a fresh database:
//! enrollment, facts, heartbeats at a fixed interval, job claims and result uploads.
//! Prints requests/s, latency percentiles per request kind, and each server's CPU and RSS.
//!
//! `cargo build --release -p heddle-server -p heddle-e2e &&
//!  HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh) target/release/heddle-loadgen --agents 10000`
//!
//! With `--fabric`, the agents are the nodes of a generated fat tree instead and the
//! server runs a fabric investigation over them (`loadgen/fabric.rs`).

#[path = "loadgen/fabric.rs"]
mod fabric;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use heddle_e2e::compare;
use heddle_e2e::probe::{Activity, CpuWindow, postmaster_pid};
use heddle_e2e::{ServerProcess, free_port, rss_kib};
use heddle_server::testing::TestDb;
use serde_json::json;

#[derive(Parser)]
#[command(about = "Load generator simulating Heddle agents")]
struct Args {
    /// Simulated agents.
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Seconds between one agent's heartbeats.
    #[arg(long, default_value_t = 10)]
    heartbeat_s: u64,
    /// Length of the measured steady state, in seconds.
    #[arg(long, default_value_t = 30)]
    duration_s: u64,
    /// Server processes sharing the database; agents are spread over them.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Fraction of agents that get a job (claim + result upload of 16 rows) during the run.
    #[arg(long, default_value_t = 0.1)]
    job_fraction: f64,
    /// Agents enrolling (and uploading their first facts) at once in the set-up phase.
    #[arg(long, default_value_t = 256)]
    setup_concurrency: usize,
    /// Requests in flight at most in the steady state (as many HTTP/1.1 connections, kept
    /// alive). A request's latency counts from when it was due, waiting for a slot included.
    #[arg(long, default_value_t = 1024)]
    max_in_flight: usize,
    /// The servers' HEDDLE_HEARTBEAT_FLUSH_MS (their default when unset).
    #[arg(long)]
    flush_ms: Option<u64>,
    /// The servers' per-credential rate limit (HEDDLE_RATE_LIMIT_PER_S and _BURST). Every
    /// simulated agent enrolls from this one address, which the limit counts as one
    /// caller, so the default is high; the layer stays in place.
    #[arg(long, default_value_t = 1_000_000)]
    rate_limit_per_s: u32,
    /// Seconds to wait after the set-up for the plugins to have evaluated every node.
    #[arg(long, default_value_t = 600)]
    settle_timeout_s: u64,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    json: bool,
    /// A stored report (`--json`) or `scripts/bench-protocol.sh`'s file of them: print
    /// each figure's ratio to the baseline's case of the same agents and replicas (in the
    /// JSON, under "compare").
    #[arg(long, value_name = "BASELINE.json")]
    compare: Option<std::path::PathBuf>,
    /// With --compare: exit 3 when a latency is more than 1.5 times the baseline's or
    /// there are errors the baseline did not have.
    #[arg(long, requires = "compare")]
    fail_if_worse: bool,
    /// Fabric mode (`--fabric` and its options): `loadgen/fabric.rs`.
    #[command(flatten)]
    fabric: fabric::FabricArgs,
}

const ADMIN: &str = "hdl_loadgen-admin-token-000000000000000000000000000";

/// Latencies per request kind counted from when a request was due (waiting for a slot
/// included), the same counted from when it was sent (the server's answer time plus
/// loopback), and the number of failed requests.
#[derive(Default)]
struct Samples(
    BTreeMap<&'static str, Vec<f64>>,
    u64,
    BTreeMap<&'static str, Vec<f64>>,
    /// Failures by request kind and what came back ("heartbeat 503", "result timeout").
    BTreeMap<String, u64>,
);

impl Samples {
    fn add(&mut self, kind: &'static str, ms: f64, ok: bool) {
        self.0.entry(kind).or_default().push(ms);
        if !ok {
            self.1 += 1;
        }
    }

    /// A failed request's kind and answer, kept beside its count.
    fn failed(&mut self, kind: &'static str, what: &str) {
        *self.3.entry(format!("{kind} {what}")).or_default() += 1;
    }

    /// `due` and `sent` are when the request was due and when it went out.
    fn add_timed(&mut self, kind: &'static str, due: Instant, sent: Instant, ok: bool) {
        self.add(kind, due.elapsed().as_secs_f64() * 1e3, ok);
        self.2
            .entry(kind)
            .or_default()
            .push(sent.elapsed().as_secs_f64() * 1e3);
    }
}

fn summary(v: &[f64]) -> serde_json::Value {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    json!({"count": v.len(), "p50_ms": pct(&v, 0.5), "p99_ms": pct(&v, 0.99), "max_ms": pct(&v, 1.0)})
}

/// The machine's 1-minute load average (everything else running skews the figures).
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// From a server's `/metrics` text: the mean and count of each agent route's time and of
/// each pool's connection waits (`{"route /api/v1/agent/heartbeat": {"count", "mean_ms"}}`).
fn server_means(text: &str) -> serde_json::Value {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let key = match name {
            "heddle_http_request_duration_seconds_sum"
            | "heddle_http_request_duration_seconds_count"
                if labels.contains("/api/v1/agent/") =>
            {
                format!("route {}", labels.split('"').nth(1).unwrap_or(""))
            }
            "heddle_db_pool_acquire_seconds_sum" | "heddle_db_pool_acquire_seconds_count" => {
                format!("pool wait {}", labels.split('"').nth(1).unwrap_or(""))
            }
            _ => continue,
        };
        let e = sums.entry(key).or_default();
        if name.ends_with("_sum") {
            e.0 += value;
        } else {
            e.1 += value;
        }
    }
    sums.into_iter()
        .map(|(k, (sum, n))| {
            (
                k,
                json!({"count": n, "mean_ms": if n > 0.0 { sum / n * 1e3 } else { f64::NAN }}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// What a failed request got: its status, or the kind of transport error.
fn answer_of(r: &Result<reqwest::Response, reqwest::Error>) -> String {
    match r {
        Ok(r) => r.status().as_u16().to_string(),
        Err(e) if e.is_timeout() => "timeout".into(),
        Err(e) if e.is_connect() => "connect error".into(),
        Err(_) => "transport error".into(),
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Agent {
    credential: String,
    base: String,
    has_job: bool,
    facts_sha256: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let db = TestDb::create().await;
    let mut env = vec![
        ("HEDDLE_RATE_LIMIT_PER_S", args.rate_limit_per_s.to_string()),
        ("HEDDLE_RATE_LIMIT_BURST", args.rate_limit_per_s.to_string()),
    ];
    if let Some(ms) = args.flush_ms {
        env.push(("HEDDLE_HEARTBEAT_FLUSH_MS", ms.to_string()));
    }
    let mut servers = Vec::new();
    for _ in 0..args.replicas.max(1) {
        servers.push(
            ServerProcess::start(&db.url, free_port(), ADMIN, args.heartbeat_s as u32, &env)
                .await?,
        );
    }
    let clients: Vec<reqwest::Client> = (0..64).map(|_| reqwest::Client::new()).collect();
    let http = &clients[0];
    let token: serde_json::Value = http
        .post(format!("{}/api/v1/enrollment-tokens", servers[0].url))
        .bearer_auth(ADMIN)
        .json(&json!({"max_uses": args.agents + 1}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let token = token["token"].as_str().unwrap().to_string();

    // Enrollment and a first facts upload, --setup-concurrency at a time.
    let postmaster = postmaster_pid(&db.url).await;
    let pids: Vec<u32> = servers.iter().map(ServerProcess::pid).collect();
    let setup_activity = Activity::start(&db.url, Duration::from_millis(500), 48).await?;
    let setup_cpu = CpuWindow::start(&pids, postmaster);
    let setup = Instant::now();
    let samples = Arc::new(Mutex::new(Samples::default()));
    let job_every = if args.job_fraction > 0.0 {
        (1.0 / args.job_fraction).round() as usize
    } else {
        usize::MAX
    };
    let (fabric_mode, agents_n, nics) = (
        args.fabric.fabric,
        args.agents,
        if args.fabric.fabric {
            args.fabric.rails
        } else {
            4
        },
    );
    let agents: Vec<Agent> = futures::stream::iter(0..args.agents)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            let base = servers[i % servers.len()].url.clone();
            let token = token.clone();
            let samples = samples.clone();
            let host = if fabric_mode {
                heddle_types::fabric::generate::node_name(i, agents_n)
            } else {
                format!("sim-{i:05}")
            };
            async move {
                let t = Instant::now();
                let resp = client
                    .post(format!("{base}/api/v1/agent/enroll"))
                    .json(&json!({"enroll_token": token, "hostname": host}))
                    .send()
                    .await?;
                let status = resp.status();
                if !status.is_success() {
                    anyhow::bail!("enrolling {host}: {status} {}", resp.text().await.unwrap_or_default());
                }
                let r: serde_json::Value = resp.json().await?;
                samples.lock().unwrap().add("enroll", t.elapsed().as_secs_f64() * 1e3, true);
                let credential = r["credential"].as_str().unwrap().to_string();
                let facts = json!({"schema_version": 1, "host": {"hostname": host},
                    "gpus": (0..8).map(|g| json!({"index": g, "name": "NVIDIA H200"})).collect::<Vec<_>>(),
                    "rdma": {"devices": (0..nics).map(|d| json!({"name": format!("mlx5_{d}"), "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}]})).collect::<Vec<_>>()}});
                // As the agent does: the hash in a header, and in every heartbeat after.
                let facts_sha256 = heddle_types::facts_sha256(&facts);
                let t = Instant::now();
                let ok = client.put(format!("{base}/api/v1/agent/facts")).bearer_auth(&credential)
                    .header(heddle_types::FACTS_SHA_HEADER, &facts_sha256).json(&facts).send().await?.status().is_success();
                samples.lock().unwrap().add("facts", t.elapsed().as_secs_f64() * 1e3, ok);
                anyhow::Ok(Agent { credential, base, has_job: i % job_every == 0, facts_sha256 })
            }
        })
        .buffer_unordered(args.setup_concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let setup_s = setup.elapsed().as_secs_f64();
    let setup_cpu = setup_cpu.end();
    let setup_backends = setup_activity.means();
    drop(setup_activity);

    // The plugins evaluate every new node after its first facts, and the servers compute
    // each node's job environment version after them; the steady state starts when both
    // are done, so it measures a fleet at rest rather than the tail of its arrival.
    let settle = Instant::now();
    let pool = sqlx::PgPool::connect(&db.url).await?;
    loop {
        // The plugins' results, and the job environment versions they change (computed by
        // the servers' versions worker).
        let (due,): (i64,) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM plugins_due_nodes) + (SELECT count(*) FROM nodes WHERE job_env_sha256 IS NULL)",
        )
        .fetch_one(&pool)
        .await?;
        if due == 0 {
            break;
        }
        anyhow::ensure!(
            settle.elapsed() < Duration::from_secs(args.settle_timeout_s),
            "{due} nodes still await their plugins or job environment versions after {} s",
            args.settle_timeout_s
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    pool.close().await;
    let plugins_settled_s = settle.elapsed().as_secs_f64();

    if args.fabric.fabric {
        let setup = fabric::Setup {
            base: &servers[0].url,
            server_pid: pids[0],
            cpu: CpuWindow::start(&pids, postmaster),
            clients: &clients,
            hb: Duration::from_secs(args.heartbeat_s),
            report: json!({"agents": args.agents, "heartbeat_s": args.heartbeat_s,
                "setup_s": setup_s, "plugins_settled_s": plugins_settled_s}),
        };
        let found = fabric::measure(&args.fabric, setup, agents, args.json).await?;
        drop(servers);
        if !found {
            eprintln!("heddle-loadgen: the investigation did not name exactly the fault(s)");
            std::process::exit(1);
        }
        return Ok(());
    }

    // Jobs for a fraction of the nodes, in runs of at most 1000 nodes.
    let job_hosts: Vec<String> = (0..args.agents)
        .filter(|i| i % job_every == 0)
        .map(|i| format!("sim-{i:05}"))
        .collect();
    for chunk in job_hosts.chunks(1000) {
        http.post(format!("{}/api/v1/runs", servers[0].url))
            .bearer_auth(ADMIN)
            .json(&json!({"kind": "memcpy", "nodes": chunk}))
            .send()
            .await?
            .error_for_status()?;
    }

    // Steady state: every agent heartbeats once per interval, at a random phase.
    let steady = Arc::new(Mutex::new(Samples::default()));
    let activity = Activity::start(&db.url, Duration::from_millis(500), 48).await?;
    let cpu_window = CpuWindow::start(&pids, postmaster);
    let load0 = loadavg();
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration_s);
    let hb = Duration::from_secs(args.heartbeat_s);
    let slots = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight.max(1)));
    let mut tasks = Vec::new();
    for (i, agent) in agents.into_iter().enumerate() {
        let client = clients[i % clients.len()].clone();
        let steady = steady.clone();
        let slots = slots.clone();
        let phase = hb.mul_f64((i as f64 * 0.618_033_988_75).fract());
        // Built once: the generator's own CPU is part of what a run on one machine measures.
        let hb_url = format!("{}/api/v1/agent/heartbeat", agent.base);
        let hb_body = json!({"agent_version": "loadgen", "facts_sha256": agent.facts_sha256, "running_jobs": []})
            .to_string();
        let bearer = format!("Bearer {}", agent.credential);
        tasks.push(tokio::spawn(async move {
            let mut next = tokio::time::Instant::from_std(start) + phase;
            let mut job_done = !agent.has_job;
            // The last heartbeat falls before `end`: sleeping past it would stretch the
            // measured window and understate the request rate.
            while next.into_std() < end {
                tokio::time::sleep_until(next).await;
                let t = Instant::now();
                // A slot per request: one agent's slow claim does not hold up others' heartbeats.
                let slot = slots.acquire().await.expect("never closed");
                let sent = Instant::now();
                let answer = client
                    .post(&hb_url)
                    .header(reqwest::header::AUTHORIZATION, &bearer)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(hb_body.clone())
                    .send()
                    .await;
                let ok = answer.as_ref().is_ok_and(|r| r.status().is_success());
                {
                    let mut steady = steady.lock().unwrap();
                    steady.add_timed("heartbeat", t, sent, ok);
                    if !ok {
                        steady.failed("heartbeat", &answer_of(&answer));
                    }
                }
                drop(slot);
                if !job_done {
                    let t = Instant::now();
                    let slot = slots.acquire().await.expect("never closed");
                    let sent = Instant::now();
                    let r = client.post(format!("{}/api/v1/agent/jobs/claim", agent.base)).bearer_auth(&agent.credential).send().await;
                    let what = answer_of(&r);
                    let lease: Option<serde_json::Value> = match r {
                        Ok(r) if r.status() == 200 => r.json().await.ok(),
                        _ => None,
                    };
                    {
                        let mut steady = steady.lock().unwrap();
                        steady.add_timed("claim", t, sent, lease.is_some());
                        if lease.is_none() {
                            steady.failed("claim", &what);
                        }
                    }
                    drop(slot);
                    if let Some(lease) = lease {
                        let rows: Vec<_> = (0..16).map(|k| json!({"size_bytes": 8i64 << k, "time_us": 10.0 + k as f64, "algbw_gbs": 1.0, "busbw_gbs": 1.0, "wrong": 0})).collect();
                        let body = json!({"upload_key": uuid::Uuid::new_v4().to_string(), "outcome": "succeeded", "rows": rows,
                            "started_at": chrono::Utc::now(), "finished_at": chrono::Utc::now()});
                        let t = Instant::now();
                        let _slot = slots.acquire().await.expect("never closed");
                        let sent = Instant::now();
                        let answer = client
                            .post(format!("{}/api/v1/agent/jobs/{}/result", agent.base, lease["job_id"].as_str().unwrap()))
                            .bearer_auth(&agent.credential)
                            .json(&body)
                            .send()
                            .await;
                        let ok = answer.as_ref().is_ok_and(|r| r.status().is_success());
                        let mut steady = steady.lock().unwrap();
                        steady.add_timed("result", t, sent, ok);
                        if !ok {
                            steady.failed("result", &answer_of(&answer));
                        }
                    }
                    job_done = true;
                }
                next += hb;
            }
        }));
    }
    let mut rss_peak: Vec<u64> = vec![0; servers.len()];
    while Instant::now() < end {
        for (k, s) in servers.iter().enumerate() {
            rss_peak[k] = rss_peak[k].max(rss_kib(s.pid()).unwrap_or(0));
        }
        tokio::time::sleep(
            Duration::from_millis(500).min(end.saturating_duration_since(Instant::now())),
        )
        .await;
    }
    // Rates and CPU cover exactly the steady state; tasks still finishing their last
    // request after it are not counted against it.
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_parts = cpu_window.end();
    let pg_activity = activity.means();
    drop(activity);
    let cpu: Vec<f64> = serde_json::from_value(cpu_parts["servers"].clone())?;
    for t in tasks {
        t.await?;
    }
    // The servers' own view (their /metrics): time per agent route and waits per pool,
    // since start; set-up included.
    let mut server_side = Vec::new();
    for s in &servers {
        let text = http
            .get(format!("{}/metrics", s.url))
            .bearer_auth(ADMIN)
            .send()
            .await?
            .text()
            .await?;
        server_side.push(server_means(&text));
    }

    let setup_samples = samples.lock().unwrap();
    let steady = steady.lock().unwrap();
    let total: usize = steady.0.values().map(Vec::len).sum();
    let mut report = serde_json::Map::new();
    report.insert("agents".into(), json!(args.agents));
    report.insert("replicas".into(), json!(servers.len()));
    report.insert("heartbeat_s".into(), json!(args.heartbeat_s));
    report.insert("steady_s".into(), json!(elapsed));
    report.insert("requests_per_s".into(), json!(total as f64 / elapsed));
    report.insert("errors".into(), json!(steady.1 + setup_samples.1));
    report.insert("failures".into(), json!(steady.3));
    report.insert("server_side".into(), json!(server_side));
    report.insert("server_cpu_percent".into(), json!(cpu));
    // Who used the machine in the steady state: Postgres, the generator, all cores busy.
    report.insert("cpu_percent".into(), cpu_parts);
    // Mean count of Postgres client backends per state and wait.
    report.insert("pg_backends".into(), json!(pg_activity));
    report.insert(
        "server_rss_peak_mib".into(),
        json!(
            rss_peak
                .iter()
                .map(|k| *k as f64 / 1024.0)
                .collect::<Vec<_>>()
        ),
    );
    report.insert("setup_s".into(), json!(setup_s));
    report.insert("setup_cpu_percent".into(), setup_cpu);
    report.insert("plugins_settled_s".into(), json!(plugins_settled_s));
    report.insert("setup_pg_backends".into(), json!(setup_backends));
    // What else ran: the 1-minute load average at the start and the end of the steady state.
    report.insert("loadavg_1m".into(), json!([load0, loadavg()]));
    let mut kinds = serde_json::Map::new();
    for (kind, v) in setup_samples.0.iter().chain(steady.0.iter()) {
        kinds.insert(kind.to_string(), summary(v));
    }
    report.insert("latency".into(), serde_json::Value::Object(kinds.clone()));
    let sent: serde_json::Map<String, serde_json::Value> = steady
        .2
        .iter()
        .map(|(k, v)| (k.to_string(), summary(v)))
        .collect();
    report.insert(
        "latency_from_sent".into(),
        serde_json::Value::Object(sent.clone()),
    );
    let compared = match &args.compare {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("reading the baseline {}: {e}", path.display()))?;
            let baseline: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("the baseline {} is not JSON: {e}", path.display()))?;
            let now = serde_json::Value::Object(report.clone());
            let then = compare::pick(&baseline, &now)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            let c = compare::compare(then, &now);
            report.insert("compare".into(), c.to_json());
            Some(c)
        }
        None => None,
    };
    if args.json {
        println!("{}", serde_json::Value::Object(report));
    } else {
        println!(
            "agents {} · replicas {} · heartbeat every {} s · steady state {:.1} s",
            args.agents,
            servers.len(),
            args.heartbeat_s,
            elapsed
        );
        println!(
            "requests/s {:.0} · errors {} · server CPU {:?} % · server RSS peak {:?} MiB",
            total as f64 / elapsed,
            steady.1 + setup_samples.1,
            cpu.iter()
                .map(|c| (c * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
            rss_peak
                .iter()
                .map(|k| (*k as f64 / 1024.0 * 10.0).round() / 10.0)
                .collect::<Vec<_>>()
        );
        if !steady.3.is_empty() {
            println!("failed requests: {:?}", steady.3);
        }
        println!(
            "{:<17} {:>8} {:>9} {:>9} {:>9}",
            "request", "count", "p50 ms", "p99 ms", "max ms"
        );
        let rows = kinds
            .iter()
            .map(|(k, v)| (k.clone(), v))
            .chain(sent.iter().map(|(k, v)| (format!("{k} (sent)"), v)));
        for (kind, v) in rows {
            println!(
                "{:<17} {:>8} {:>9.2} {:>9.2} {:>9.2}",
                kind,
                v["count"],
                v["p50_ms"].as_f64().unwrap(),
                v["p99_ms"].as_f64().unwrap(),
                v["max_ms"].as_f64().unwrap()
            );
        }
        for (what, cpu, backends) in [
            ("set-up", "setup_cpu_percent", "setup_pg_backends"),
            ("steady state", "cpu_percent", "pg_backends"),
        ] {
            println!("CPU % in the {what}: {}", report[cpu]);
            println!("Postgres client backends in the {what} (mean count):");
            let mut b: Vec<_> = report[backends].as_object().into_iter().flatten().collect();
            b.sort_by(|x, y| {
                y.1.as_f64()
                    .unwrap_or(0.0)
                    .total_cmp(&x.1.as_f64().unwrap_or(0.0))
            });
            for (k, n) in b.into_iter().take(12) {
                println!("  {:>7.2}  {k}", n.as_f64().unwrap_or(0.0));
            }
        }
        println!(
            "(setup: {} enrollments + facts in {:.1} s, plugins done {:.1} s later; load average {:.2} -> {:.2})",
            args.agents,
            setup_s,
            plugins_settled_s,
            load0,
            loadavg()
        );
    }
    if let Some(c) = &compared
        && !args.json
    {
        c.print();
    }
    drop(servers);
    if args.fail_if_worse && compared.is_some_and(|c| c.worse() > 0) {
        eprintln!("heddle-loadgen: worse than the baseline (see \"compare\")");
        std::process::exit(3);
    }
    Ok(())
}
