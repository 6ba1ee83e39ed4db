//! Faults between the replicas and Postgres, in the Docker fleet. Postgres is on a network
//! of its own that only the replicas join; agents and the test stay on the fleet network.
//! - Postgres restarted while the plugin reconciler holds a claimed batch (the replicas run
//!   with `HEDDLE_RECONCILER_HOLD_MS`), jobs in flight: the batch is evaluated again after
//!   the return, every node's plugin results are whole, every result is stored once;
//! - `srv-a` cut off from Postgres (`docker network disconnect`) for 30 s
//!   (`HEDDLE_CUT_S`) while jobs run: `srv-b` answers throughout, `srv-a` answers 503, never
//!   500, and is ready again soon after; nothing is requeued, every result is stored once.
//!
//! Needs the images (`scripts/fleet-test.sh --prepare`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::ensure;
use heddle_e2e::fleet::{docker, preflight, wait_for};
use heddle_e2e::fleet_ops::{AgentSpec, Cluster, secs_from_env};
use serde_json::json;

const HEARTBEAT_S: u64 = 2;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
/// Each claimed batch is held this long before it is evaluated.
const HOLD_MS: u64 = 4000;
const HOLD_LINE: &str = "plugin reconciler holding a claimed batch";
const PLUGIN: &str = "runai-roce";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_db_faults() {
    if let Err(e) = preflight() {
        panic!("{e:#}");
    }
    let mut c = Cluster::new("fleet-db-faults").expect("docker network create");
    if let Err(e) = scenario(&mut c).await {
        panic!("{e:#}\n\ncontainer logs:{}", c.fleet.all_logs());
    }
}

async fn scenario(c: &mut Cluster) -> anyhow::Result<()> {
    let db_net = c.fleet.add_network("db")?;
    c.fleet.run_on(&db_net, "pg", "heddle-postgres", &[])?;
    c.wait_pg().await?;
    let env = Cluster::server_env(
        HEARTBEAT_S,
        &[("HEDDLE_RECONCILER_HOLD_MS", HOLD_MS.to_string())],
    );
    c.fleet
        .run_also_on("srv-a", "heddle-server", &env, &[], &[&db_net])?;
    c.fleet
        .run_also_on("srv-b", "heddle-server", &env, &[], &[&db_net])?;
    c.wait_ready("srv-a", Duration::from_secs(60)).await?;
    c.wait_ready("srv-b", Duration::from_secs(60)).await?;
    let agents = NODES
        .iter()
        .map(|node| AgentSpec {
            node,
            env: vec![],
            docker_args: vec![],
        })
        .collect();
    c.start_agents(agents).await?;
    plugins_settled(c).await?;
    c.step("Postgres on its own network, two replicas on both, three agents, plugins run");

    postgres_restart_under_a_held_batch(c).await?;
    replica_cut_from_postgres(c, &db_net).await?;
    let (jobs, results) = c.assert_all_results_once()?;
    c.step(&format!(
        "{jobs} jobs, {results} results, each at most once"
    ));
    Ok(())
}

/// Every node has one result per enabled plugin, none of a disabled one, and none is due.
async fn plugins_settled(c: &Cluster) -> anyhow::Result<String> {
    wait_for("plugin results settled", Duration::from_secs(90), || async {
        let wrong = c.sql(
            "SELECT n.hostname, count(r.*) FILTER (WHERE p.enabled), count(r.*) FILTER (WHERE NOT p.enabled),
                    (SELECT count(*) FROM plugins WHERE enabled AND active_version_id IS NOT NULL)
             FROM nodes n LEFT JOIN plugin_results r ON r.node_id = n.id LEFT JOIN plugins p ON p.id = r.plugin_id
             GROUP BY n.id, n.hostname
             HAVING count(r.*) FILTER (WHERE NOT p.enabled) > 0
                 OR count(r.*) FILTER (WHERE p.enabled)
                    <> (SELECT count(*) FROM plugins WHERE enabled AND active_version_id IS NOT NULL)",
        )?;
        let due = c.sql("SELECT count(*) FROM nodes WHERE plugins_due")?;
        Ok((wrong.is_empty() && due == "0").then_some(()))
    })
    .await?;
    c.sql("SELECT count(*) FROM plugin_results")
}

fn hold_lines(c: &Cluster) -> usize {
    ["srv-a", "srv-b"]
        .iter()
        .map(|s| c.fleet.full_log(s).matches(HOLD_LINE).count())
        .sum()
}

async fn postgres_restart_under_a_held_batch(c: &Cluster) -> anyhow::Result<()> {
    let a = c.url("srv-a")?;
    let memcpy = c
        .start_run(
            &a,
            "memcpy",
            json!({"max_bytes": 1 << 20, "iters": 3}),
            &NODES,
        )
        .await?;
    let sleep = c
        .start_run(&a, "sleep", json!({"seconds": 8}), &NODES)
        .await?;
    let held_before = hold_lines(c);
    // Disabling a plugin leaves its results on every node to be removed: a batch of three.
    c.post(&a, &format!("/api/v1/plugins/{PLUGIN}/disable"), json!({}))
        .await?;
    wait_for("a batch held", Duration::from_secs(30), || async {
        Ok((hold_lines(c) > held_before).then_some(()))
    })
    .await?;
    let held = Instant::now();
    docker(&["restart", "-t", "5", &c.fleet.name("pg")])?;
    let restarted_after = held.elapsed();
    ensure!(
        restarted_after < Duration::from_millis(HOLD_MS),
        "Postgres restart took {restarted_after:?}, longer than the hold"
    );
    c.wait_pg().await?;
    let back = held.elapsed();
    c.wait_ready("srv-a", Duration::from_secs(60)).await?;
    c.wait_ready("srv-b", Duration::from_secs(60)).await?;
    let rows = plugins_settled(c).await?;
    let settled = held.elapsed();
    let leftovers = c.sql(&format!(
        "SELECT count(*) FROM plugin_results r JOIN plugins p ON p.id = r.plugin_id WHERE p.name = '{PLUGIN}'"
    ))?;
    ensure!(
        leftovers == "0",
        "{leftovers} results of the disabled plugin left"
    );
    let failed_batches: usize = ["srv-a", "srv-b"]
        .iter()
        .map(|s| {
            c.fleet
                .full_log(s)
                .matches("plugin reconciler failed; will retry")
                .count()
        })
        .sum();
    for run in [&memcpy, &sleep] {
        Cluster::ensure_succeeded(&c.finished(run, Duration::from_secs(90)).await?)?;
    }
    let attempts = c.sql(&format!(
        "SELECT sum(attempts) FROM jobs WHERE run_id IN ('{memcpy}', '{sleep}')"
    ))?;
    c.assert_all_results_once()?;
    c.post(&a, &format!("/api/v1/plugins/{PLUGIN}/enable"), json!({}))
        .await?;
    plugins_settled(c).await?;
    c.step(&format!(
        "Postgres restarted {:.1} s into a held batch (ready {:.1} s after the hold began; \
         {failed_batches} batch(es) broken and retried); plugins settled {:.1} s after, \
         {rows} plugin result rows, none left of the disabled plugin; 6 jobs, attempts {attempts}, once each",
        restarted_after.as_secs_f64(),
        back.as_secs_f64(),
        settled.as_secs_f64()
    ));
    Ok(())
}

async fn replica_cut_from_postgres(c: &Cluster, db_net: &str) -> anyhow::Result<()> {
    let cut_for = secs_from_env("HEDDLE_CUT_S", 30);
    let a = c.url("srv-a")?;
    let b = c.url("srv-b")?;
    let sleep = c
        .start_run(
            &b,
            "sleep",
            json!({"seconds": cut_for.as_secs() + 6}),
            &NODES,
        )
        .await?;
    wait_for("three jobs running", Duration::from_secs(30), || async {
        let n = c.sql(&format!(
            "SELECT count(*) FROM jobs WHERE run_id = '{sleep}' AND state = 'running'"
        ))?;
        Ok((n == "3").then_some(()))
    })
    .await?;
    c.fleet.disconnect(db_net, "srv-a")?;
    let cut = Instant::now();
    let mut answers: BTreeMap<(&str, u16), u32> = BTreeMap::new();
    let mut no_answer = 0u32;
    let mut during = Vec::new();
    while cut.elapsed() < cut_for {
        if during.len() < 3 && cut.elapsed() > Duration::from_secs(5) {
            // New work through the replica that still reaches the database.
            during.push(
                c.start_run(
                    &b,
                    "memcpy",
                    json!({"max_bytes": 1 << 20, "iters": 3}),
                    &NODES,
                )
                .await?,
            );
        }
        for (name, base) in [("srv-a", &a), ("srv-b", &b)] {
            for path in ["/api/v1/nodes", "/readyz"] {
                match c.get(base, path).await {
                    Ok((status, body)) => {
                        *answers.entry((name, status)).or_default() += 1;
                        let fine = if name == "srv-b" {
                            status == 200
                        } else {
                            status == 503 || status == 200
                        };
                        ensure!(fine, "{name} GET {path} during the cut: {status}: {body}");
                    }
                    Err(_) if name == "srv-a" => no_answer += 1,
                    Err(e) => return Err(e.context("srv-b did not answer during the cut")),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.fleet.connect(db_net, "srv-a")?;
    let rejoined = Instant::now();
    c.wait_ready("srv-a", Duration::from_secs(60)).await?;
    let ready_after = rejoined.elapsed();
    let (status, body) = c.get(&a, "/api/v1/nodes").await?;
    ensure!(status == 200, "srv-a after the cut: {status}: {body}");
    for run in during.iter().chain([&sleep]) {
        Cluster::ensure_succeeded(&c.finished(run, Duration::from_secs(90)).await?)?;
    }
    let requeued = c.sql(&format!(
        "SELECT sum(attempts - 1) FROM jobs WHERE run_id IN ('{sleep}', {})",
        during
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(", ")
    ))?;
    ensure!(requeued == "0", "{requeued} jobs requeued by the cut");
    ensure!(
        answers.get(&("srv-a", 503)).copied().unwrap_or(0) > 0,
        "srv-a never answered 503 during the cut: {answers:?}"
    );
    c.assert_all_results_once()?;
    c.step(&format!(
        "srv-a cut from Postgres {:.0} s: answers {answers:?}, srv-a no answer {no_answer}; \
         srv-a ready {:.1} s after rejoining; {} runs started through srv-b meanwhile; 0 requeued, once each",
        cut_for.as_secs_f64(),
        ready_after.as_secs_f64(),
        during.len()
    ));
    Ok(())
}
