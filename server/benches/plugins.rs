//! The three first-party plugins (or the Python template) over 10,000 stored node facts.
//!
//! Part 1 runs every plugin on every node's facts as the reconciler does (facts read from
//! Postgres and checked once per node, each call in a fresh store, spread over one thread per
//! core) and reports the wall time, per-call latency and compile-cache hits.
//! Part 2 times the whole reconciler, Postgres writes included, on a smaller fleet.
//!
//! `scripts/build-plugins.sh && HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh) cargo bench -p heddle-server --bench plugins`
//!
//! `HEDDLE_BENCH_PLUGINS=template-python` (after scripts/build-python-plugin.sh) runs the
//! Python template instead: CPython in every call's fresh store.

use std::sync::Arc;
use std::time::Instant;

use heddle_plugin_host::FactsJson;
use heddle_server::plugins::{self, PluginRuntime};
use heddle_server::testing::TestServer;
use serde_json::Value;
use uuid::Uuid;

/// The allocator the server binary uses (src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Components of plugins/dist to run (`HEDDLE_BENCH_PLUGINS`, comma-separated), with the
/// name each is uploaded under (its `info().name`).
fn plugins() -> Vec<(String, String)> {
    let list = std::env::var("HEDDLE_BENCH_PLUGINS")
        .unwrap_or_else(|_| "azure-nd,runai-roce,dgx-affinity".into());
    list.split(',')
        .map(|file| {
            let name = match file {
                "template-python" => "my-python-plugin",
                other => other,
            };
            (file.to_string(), name.to_string())
        })
        .collect()
}

const FIXTURES: [&str; 3] = ["azure-nd40rs-v2", "runai-roce", "dgx1"];

fn read(path: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/build-plugins.sh)", p.display()))
}

/// CPU seconds (user, system) this process has used: on a machine shared with other work the
/// wall time of a phase includes time spent waiting for a core, its CPU time does not.
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th, in
    // clock ticks (USER_HZ, 100 on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let t: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    (
        t.first().copied().unwrap_or(0.0) / 100.0,
        t.get(1).copied().unwrap_or(0.0) / 100.0,
    )
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Inserts `n` nodes whose facts cycle through the fixtures, each with its own hostname.
async fn seed_nodes(db: &sqlx::PgPool, n: usize) {
    let fixtures: Vec<Value> = FIXTURES
        .iter()
        .map(|f| serde_json::from_slice(&read(&format!("plugins/fixtures/{f}.json"))).unwrap())
        .collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO nodes (id, hostname, facts, facts_sha256) ",
        );
        qb.push_values(chunk, |mut b, i| {
            let mut facts = fixtures[i % fixtures.len()].clone();
            facts["host"]["hostname"] = Value::String(format!("bench-{i:05}"));
            let sha = heddle_types::facts_sha256(&facts);
            b.push_bind(Uuid::new_v4())
                .push_bind(format!("bench-{i:05}"))
                .push_bind(facts)
                .push_bind(sha);
        });
        qb.build().execute(db).await.unwrap();
    }
}

async fn enable_plugins(server: &TestServer) {
    let http = reqwest::Client::new();
    for (file, name) in plugins() {
        let r = http
            .post(format!(
                "{}/api/v1/plugins/{name}/versions/0.1.0",
                server.url
            ))
            .bearer_auth(&server.admin_token)
            .header("content-type", "application/wasm")
            .body(read(&format!("plugins/dist/{file}.wasm")))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "upload {name}: {}", r.status());
        let r = http
            .post(format!("{}/api/v1/plugins/{name}/enable", server.url))
            .bearer_auth(&server.admin_token)
            .json(&serde_json::json!({}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let nodes: usize = std::env::var("HEDDLE_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);

    // Part 1: evaluation over stored facts, without the reconciler's writes.
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 3600).await;
    seed_nodes(&server.state.db, nodes).await;
    // A fresh disk cache: the first load compiles and stores, a second runtime (as after a
    // restart) loads from it.
    let disk = tempfile::tempdir().unwrap();
    let cache_dir = Some(disk.path().join("compiled"));
    let limits = server.state.config.plugin_limits();
    let keep_resident = server.state.config.plugin_keep_resident_bytes;
    let runtime =
        Arc::new(PluginRuntime::with_options(limits, cache_dir.clone(), keep_resident).unwrap());
    let blobs: Vec<Vec<u8>> = plugins()
        .iter()
        .map(|(file, _)| read(&format!("plugins/dist/{file}.wasm")))
        .collect();
    let t = Instant::now();
    let rows: Vec<(Value,)> = sqlx::query_as("SELECT facts FROM nodes WHERE facts IS NOT NULL")
        .fetch_all(&server.state.db)
        .await
        .unwrap();
    let load_s = t.elapsed().as_secs_f64();
    // Each plugin is compiled once (as the server does on first use), then called by handle.
    let t = Instant::now();
    let mut loaded = Vec::new();
    for b in blobs {
        loaded.push(runtime.load(b).await.unwrap());
    }
    let compile_s = t.elapsed().as_secs_f64();
    let restarted = PluginRuntime::with_options(limits, cache_dir, keep_resident).unwrap();
    let t = Instant::now();
    for (file, _) in plugins() {
        restarted
            .load(read(&format!("plugins/dist/{file}.wasm")))
            .await
            .unwrap();
    }
    let cached_s = t.elapsed().as_secs_f64();
    drop(restarted);
    // As the reconciler does: facts checked once per node, every plugin called on them, the
    // calls spread over one thread per core.
    let t = Instant::now();
    let cpu = cpu_seconds();
    let evaluated = rows.len();
    let facts: Vec<FactsJson> = rows
        .into_iter()
        .map(|(f,)| FactsJson::from_value(f).unwrap())
        .collect();
    let outcomes = runtime.evaluate(loaded.clone(), facts).await;
    let mut latencies = Vec::with_capacity(outcomes.len() * loaded.len());
    let (mut hits, mut fuel, mut failed) = (0u64, 0u64, 0u64);
    for r in outcomes.into_iter().flatten() {
        match r {
            Ok(r) => {
                latencies.push(r.usage.elapsed.as_secs_f64() * 1e6);
                hits += u64::from(r.usage.cache_hit);
                fuel += r.usage.fuel_consumed;
            }
            Err(_) => failed += 1,
        }
    }
    let eval_s = t.elapsed().as_secs_f64();
    let (user_s, sys_s) = (cpu_seconds().0 - cpu.0, cpu_seconds().1 - cpu.1);
    let calls = latencies.len() as u64;
    println!(
        "plugins over stored facts: {evaluated} nodes x {} plugins",
        loaded.len()
    );
    println!("  read facts from Postgres      {:>8.3} s", load_s);
    println!(
        "  compile {} (first load)        {:>8.3} s",
        loaded.len(),
        compile_s
    );
    println!(
        "  load {} from the disk cache    {:>8.3} s",
        loaded.len(),
        cached_s
    );
    println!(
        "  all evaluations ({} threads)    {:>8.3} s  ({:.0} evaluations/s)",
        std::thread::available_parallelism().map_or(0, usize::from),
        eval_s,
        calls as f64 / eval_s
    );
    println!(
        "  CPU time, user + system       {:>8.3} s  ({user_s:.2} + {sys_s:.2}; {:.1} µs per evaluation)",
        user_s + sys_s,
        (user_s + sys_s) * 1e6 / calls.max(1) as f64
    );
    println!(
        "  per call p50 / p99 / max      {:>8.1} / {:.1} / {:.1} µs",
        pct(&mut latencies, 0.5),
        pct(&mut latencies, 0.99),
        pct(&mut latencies, 1.0)
    );
    println!(
        "  compile-cache hits            {hits} of {calls}; failures {failed}; mean fuel {}",
        fuel / calls.max(1)
    );
    server.stop().await;

    // Part 2: the reconciler end to end (evaluation + Postgres writes) on a smaller fleet.
    let fleet: usize = std::env::var("HEDDLE_BENCH_RECONCILE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 3600).await;
    seed_nodes(&server.state.db, fleet).await;
    enable_plugins(&server).await;
    // The server's own reconciler starts on enable; time until every node is evaluated.
    let t = Instant::now();
    let cpu = cpu_seconds();
    loop {
        let (done,): (i64,) = sqlx::query_as("SELECT count(*) FROM plugin_results")
            .fetch_one(&server.state.db)
            .await
            .unwrap();
        if done as usize >= fleet * plugins().len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let reconcile_s = t.elapsed().as_secs_f64();
    let (user_s, sys_s) = (cpu_seconds().0 - cpu.0, cpu_seconds().1 - cpu.1);
    let state = &server.state;
    let hold = std::time::Duration::from_millis(state.config.reconciler_hold_ms);
    let left = plugins::reconcile(&state.db, &state.plugins, &state.job_env_seen, hold)
        .await
        .unwrap();
    println!(
        "reconciler, Postgres writes included: {fleet} nodes x {} plugins in {reconcile_s:.2} s ({:.0} nodes/s); stale afterwards: {left}",
        plugins().len(),
        fleet as f64 / reconcile_s
    );
    println!(
        "  server CPU (this process, not Postgres) {:.2} s ({user_s:.2} + {sys_s:.2}; {:.0} µs per node)",
        user_s + sys_s,
        (user_s + sys_s) * 1e6 / fleet.max(1) as f64
    );
    server.stop().await;
}
