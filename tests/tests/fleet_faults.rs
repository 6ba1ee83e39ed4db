//! Faults of one machine, in the Docker fleet (Postgres, two replicas, three agents):
//! - `node-1`'s state directory is a small tmpfs, filled up, and then its spool made
//!   read-only, while results are written: they are held in memory, said so, and uploaded;
//! - `node-2`'s clock is ten minutes ahead of the server's, `node-3`'s ten minutes behind
//!   (libfaketime): leases and heartbeats are judged right, nothing is requeued;
//! - a replica is SIGKILLed in the middle of result uploads, and again in the middle of an
//!   investigation: every result is stored once, the investigation finishes.
//!
//! After each, every result is in Postgres exactly once. Needs the images
//! (`scripts/fleet-test.sh --prepare`). `HEDDLE_SKEW_RUN_S` sets how long the jobs under a
//! skewed clock run (default 12 s, six lease terms).

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use heddle_e2e::fleet::{docker, preflight, wait_for};
use heddle_e2e::fleet_ops::{AgentSpec, Cluster, STATE_DIR, secs_from_env};
use serde_json::json;

const HEARTBEAT_S: u64 = 2;
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
const HELD_LINE: &str = "cannot spool the result (disk full or read-only?); keeping it in memory";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_faults() {
    if let Err(e) = preflight() {
        panic!("{e:#}");
    }
    let mut c = Cluster::new("fleet-faults").expect("docker network create");
    if let Err(e) = scenario(&mut c).await {
        panic!("{e:#}\n\ncontainer logs:{}", c.fleet.all_logs());
    }
}

fn skewed(node: &str, offset: &str) -> AgentSpec<'static> {
    let node: &'static str = if node == "node-2" { "node-2" } else { "node-3" };
    AgentSpec {
        node,
        env: vec![
            ("LD_PRELOAD", FAKETIME_LIB.to_string()),
            ("FAKETIME", offset.to_string()),
            // Only the wall clock is off; the monotonic clock is the kernel's.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ],
        docker_args: vec![],
    }
}

async fn scenario(c: &mut Cluster) -> anyhow::Result<()> {
    c.fleet.run("pg", "heddle-postgres", &[], &[])?;
    c.wait_pg().await?;
    let env = Cluster::server_env(HEARTBEAT_S, &[]);
    c.fleet.run("srv-a", "heddle-server", &env, &[])?;
    c.fleet.run("srv-b", "heddle-server", &env, &[])?;
    c.wait_ready("srv-a", Duration::from_secs(60)).await?;
    c.wait_ready("srv-b", Duration::from_secs(60)).await?;
    let tmpfs = format!("type=tmpfs,destination={STATE_DIR},tmpfs-size=4m");
    c.start_agents(vec![
        AgentSpec {
            node: "node-1",
            env: vec![],
            // SYS_ADMIN only to make its own spool read-only.
            docker_args: vec!["--mount", &tmpfs, "--cap-add", "SYS_ADMIN"],
        },
        skewed("node-2", "+10m"),
        skewed("node-3", "-10m"),
    ])
    .await?;
    c.step("Postgres, two replicas, three agents (node-2 +10 min, node-3 -10 min)");
    let a = c.url("srv-a")?;

    disk_full(c, &a).await?;
    read_only(c, &a).await?;
    clock_skew(c, &a).await?;
    replica_killed_mid_upload(c, &a).await?;
    replica_killed_mid_investigation(c).await?;
    let (jobs, results) = c.assert_all_results_once()?;
    c.step(&format!(
        "{jobs} jobs, {results} results, each at most once"
    ));
    Ok(())
}

/// Occurrences of the held-in-memory line in node-1's log.
fn held_lines(c: &Cluster) -> usize {
    c.fleet.full_log("node-1").matches(HELD_LINE).count()
}

async fn disk_full(c: &Cluster, a: &str) -> anyhow::Result<()> {
    let fill = format!(
        "dd if=/dev/zero of={STATE_DIR}/fill bs=64k 2>/dev/null; df -k {STATE_DIR} | tail -n 1"
    );
    let df = c.fleet.exec("node-1", &["sh", "-c", &fill])?;
    let before = held_lines(c);
    let run = c
        .start_run(a, "sleep", json!({"seconds": 2}), &["node-1"])
        .await?;
    let started = Instant::now();
    let done = c.finished(&run, Duration::from_secs(60)).await?;
    Cluster::ensure_succeeded(&done)?;
    ensure!(
        held_lines(c) == before + 1,
        "the full disk was not reported"
    );
    let attempts = c.sql(&format!("SELECT attempts FROM jobs WHERE run_id = '{run}'"))?;
    ensure!(attempts == "1", "attempts {attempts}");
    c.assert_all_results_once()?;
    c.step(&format!(
        "disk full ({}): result held in memory and uploaded once, run done {:.1} s after it started",
        df.split_whitespace().collect::<Vec<_>>().join(" "),
        started.elapsed().as_secs_f64()
    ));
    // Room again: the next result goes through the spool, which empties.
    c.fleet
        .exec("node-1", &["rm", "-f", &format!("{STATE_DIR}/fill")])?;
    let run = c
        .start_run(a, "sleep", json!({"seconds": 1}), &["node-1"])
        .await?;
    Cluster::ensure_succeeded(&c.finished(&run, Duration::from_secs(60)).await?)?;
    ensure!(
        held_lines(c) == before + 1,
        "a result held with room on the disk"
    );
    c.assert_all_results_once()?;
    Ok(())
}

async fn read_only(c: &Cluster, a: &str) -> anyhow::Result<()> {
    // The spool made a read-only bind of itself (remounting the whole tmpfs read-only would
    // be refused while the agent holds its lock file open for writing).
    let spool = format!("{STATE_DIR}/spool");
    let ro = format!("mount --bind {spool} {spool} && mount -o remount,bind,ro {spool}");
    c.fleet.exec("node-1", &["sh", "-c", &ro])?;
    let before = held_lines(c);
    let run = c
        .start_run(
            a,
            "memcpy",
            json!({"max_bytes": 1 << 20, "iters": 3}),
            &["node-1"],
        )
        .await?;
    let done = c.finished(&run, Duration::from_secs(60)).await?;
    Cluster::ensure_succeeded(&done)?;
    ensure!(
        held_lines(c) == before + 1,
        "the read-only spool was not reported"
    );
    c.fleet.exec("node-1", &["umount", &spool])?;
    c.assert_all_results_once()?;
    c.step("state directory read-only: result held in memory, uploaded once");
    Ok(())
}

async fn clock_skew(c: &Cluster, a: &str) -> anyhow::Result<()> {
    let secs = secs_from_env("HEDDLE_SKEW_RUN_S", 12).as_secs();
    let run = c
        .start_run(a, "sleep", json!({"seconds": secs}), &NODES)
        .await?;
    // Every node stays online throughout: heartbeats are aged on the server's clock.
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        let offline = c.sql(
            "SELECT string_agg(n.hostname, ',') FROM nodes n JOIN agents a ON a.node_id = n.id
             WHERE a.last_heartbeat_at < now() - interval '5 seconds'",
        )?;
        ensure!(offline.is_empty(), "heartbeats judged stale: {offline}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let done = c.finished(&run, Duration::from_secs(secs + 60)).await?;
    Cluster::ensure_succeeded(&done)?;
    let attempts = c.sql(&format!(
        "SELECT sum(attempts) FROM jobs WHERE run_id = '{run}'"
    ))?;
    ensure!(
        attempts == "3",
        "jobs requeued under a skewed clock: attempts {attempts}"
    );
    // The agents' own timestamps against the database's: the skew was real.
    let skew = c.sql(&format!(
        "SELECT n.hostname, round(extract(epoch FROM r.finished_at - r.received_at)) FROM results r
         JOIN jobs j ON j.id = r.job_id JOIN nodes n ON n.id = j.node_id
         WHERE j.run_id = '{run}' ORDER BY 1"
    ))?;
    let off: Vec<(String, f64)> = skew
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(h, s)| (h.to_string(), s.parse().unwrap_or(0.0)))
        .collect();
    let by = |h: &str| {
        off.iter()
            .find(|(n, _)| n == h)
            .map(|(_, s)| *s)
            .context("no result")
    };
    ensure!(
        (540.0..=660.0).contains(&by("node-2")?),
        "node-2 not ahead: {off:?}"
    );
    ensure!(
        (-660.0..=-540.0).contains(&by("node-3")?),
        "node-3 not behind: {off:?}"
    );
    c.assert_all_results_once()?;
    c.step(&format!(
        "clock skew: {secs} s jobs under {off:?} s of skew (agent - database), attempts 1 each, nodes online"
    ));
    Ok(())
}

async fn replica_killed_mid_upload(c: &Cluster, a: &str) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(
            c.start_run(
                a,
                "memcpy",
                json!({"max_bytes": 1 << 20, "iters": 3}),
                &NODES,
            )
            .await?,
        );
    }
    wait_for("the first results", Duration::from_secs(60), || async {
        let n: u64 = c
            .sql("SELECT count(*) FROM results WHERE received_at > now() - interval '30 seconds'")?
            .parse()?;
        Ok((n > 0).then_some(n))
    })
    .await?;
    let before: u64 = c.sql("SELECT count(*) FROM results")?.parse()?;
    docker(&["kill", "-s", "KILL", &c.fleet.name("srv-a")])?;
    let killed = Instant::now();
    for run in &runs {
        Cluster::ensure_succeeded(&c.finished(run, Duration::from_secs(120)).await?)?;
    }
    let served = killed.elapsed();
    let after: u64 = c.sql("SELECT count(*) FROM results")?.parse()?;
    docker(&["start", &c.fleet.name("srv-a")])?;
    c.wait_ready("srv-a", Duration::from_secs(60)).await?;
    c.assert_all_results_once()?;
    c.step(&format!(
        "srv-a SIGKILLed among 18 uploads ({} stored after the kill, all done {:.1} s after it), once each",
        after - before,
        served.as_secs_f64()
    ));
    Ok(())
}

async fn replica_killed_mid_investigation(c: &Cluster) -> anyhow::Result<()> {
    let b = c.url("srv-b")?;
    // rdma pairs end `skipped` in containers, so the investigation fails for want of a
    // figure; what matters is that it ends, whichever replica advances it.
    let inv = c
        .post(
            &b,
            "/api/v1/investigations",
            json!({"nodes": NODES, "kind": "rdma", "batch_size": 1}),
        )
        .await?;
    let id = inv["id"]
        .as_str()
        .context("investigation without id")?
        .to_string();
    let pairs = |state: &str| -> anyhow::Result<u64> {
        Ok(c.sql(&format!(
            "SELECT count(*) FROM investigation_pairs WHERE investigation_id = '{id}' AND state = '{state}'"
        ))?
        .parse()?)
    };
    wait_for("the first pair ended", Duration::from_secs(60), || async {
        Ok((pairs("done")? + pairs("failed")? >= 1).then_some(()))
    })
    .await?;
    let state = c.sql(&format!(
        "SELECT state FROM investigations WHERE id = '{id}'"
    ))?;
    ensure!(state == "running", "investigation already {state}");
    docker(&["kill", "-s", "KILL", &c.fleet.name("srv-a")])?;
    let killed = Instant::now();
    let end = wait_for(
        "the investigation to end",
        Duration::from_secs(120),
        || async {
            let s = c
                .get_json(&b, &format!("/api/v1/investigations/{id}"))
                .await?;
            Ok((s["state"] != "running").then_some(s))
        },
    )
    .await?;
    let took = killed.elapsed();
    ensure!(
        pairs("pending")? + pairs("running")? == 0,
        "pairs left: {end}"
    );
    docker(&["start", &c.fleet.name("srv-a")])?;
    c.wait_ready("srv-a", Duration::from_secs(60)).await?;
    c.assert_all_results_once()?;
    c.step(&format!(
        "srv-a SIGKILLed mid-investigation: it ended {} {:.1} s later, 3 pairs ({} done, {} failed)",
        end["state"],
        took.as_secs_f64(),
        pairs("done")?,
        pairs("failed")?
    ));
    Ok(())
}
