//! The fleet test's faults, one step each: an agent killed mid-run, an agent cut off with
//! a result pending, a replica restarted mid-upload, Postgres restarted under running work.

use super::*;

/// Fault 1: an agent killed during a sleep run; the lease lapses and the job is requeued
/// (or failed with a reason) within two heartbeat intervals, then runs to one result.
pub(crate) async fn fault_agent_killed_mid_run(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, a) = (s.ctx, &s.a);
    let run_id = ctx
        .start_run_with_env(a, "sleep", json!({"seconds": 6}), json!({}), &["node-3"])
        .await?;
    ctx.job_in(&run_id, "node-3", &["running"], Duration::from_secs(30))
        .await?;
    docker(&["kill", &ctx.fleet.name("node-3")])?;
    let killed = Instant::now();
    let job = ctx
        .job_in(
            &run_id,
            "node-3",
            &["queued", "failed"],
            Duration::from_secs(4 * HEARTBEAT_S + 10),
        )
        .await?;
    let noticed = killed.elapsed();
    // The lease is 2 intervals from its last renewal; the reaper ticks every quarter interval.
    ensure!(
        noticed <= Duration::from_secs(2 * HEARTBEAT_S) + Duration::from_millis(1500),
        "requeued after {noticed:?}: {job}"
    );
    ensure!(
        job["state"] == "queued" || job["error"].as_str().is_some_and(|e| !e.is_empty()),
        "failed without a reason: {job}"
    );
    eprintln!(
        "fleet: killed agent's job {} after {:.1} s",
        job["state"],
        noticed.as_secs_f64()
    );
    docker(&["start", &ctx.fleet.name("node-3")])?;
    let run = ctx.finished(&run_id, Duration::from_secs(60)).await?;
    ctx.assert_results_once(&run)?;
    let job = &run["jobs"][0];
    ensure!(
        job["state"] == "succeeded" && job["attempts"].as_i64() >= Some(2),
        "after restart: {job}"
    );
    ctx.step("fault: agent killed mid-run, requeued, rerun, one result");
    Ok(())
}

/// Fault 2: an agent cut off the network while its job finishes: the result waits in the
/// spool, and after reconnection is uploaded once.
pub(crate) async fn fault_agent_disconnected_with_a_pending_result(
    s: &Scenario<'_>,
) -> anyhow::Result<()> {
    let (ctx, a) = (s.ctx, &s.a);
    let run_id = ctx
        .start_run_with_env(a, "sleep", json!({"seconds": 2}), json!({}), &["node-2"])
        .await?;
    ctx.job_in(&run_id, "node-2", &["running"], Duration::from_secs(30))
        .await?;
    docker(&[
        "network",
        "disconnect",
        &ctx.fleet.network,
        &ctx.fleet.name("node-2"),
    ])?;
    wait_for(
        "the result in node-2's spool",
        Duration::from_secs(20),
        || async { Ok((ctx.spool_entries("node-2")? >= 1).then_some(())) },
    )
    .await?;
    let stored = ctx.fleet.sql("pg", &format!("SELECT count(*) FROM results r JOIN jobs j ON j.id = r.job_id WHERE j.run_id = '{run_id}'"))?;
    ensure!(stored == "0", "a result arrived from a disconnected agent");
    tokio::time::sleep(Duration::from_secs(2)).await;
    docker(&[
        "network",
        "connect",
        "--alias",
        "node-2",
        &ctx.fleet.network,
        &ctx.fleet.name("node-2"),
    ])?;
    let run = ctx.finished(&run_id, Duration::from_secs(60)).await?;
    ctx.assert_results_once(&run)?;
    ensure!(run["jobs"][0]["state"] == "succeeded", "{run}");
    wait_for(
        "node-2's spool to drain",
        Duration::from_secs(30),
        || async { Ok((ctx.spool_entries("node-2")? == 0).then_some(())) },
    )
    .await?;
    ctx.step("fault: agent disconnected with a pending result, spooled, uploaded once");
    Ok(())
}

/// Fault 3: replica A restarted while results are uploaded; B keeps serving. Returns A's
/// base URL after the restart.
pub(crate) async fn fault_replica_restarted_mid_upload(s: &Scenario<'_>) -> anyhow::Result<String> {
    let (ctx, b) = (s.ctx, &s.b);
    let runs = ctx.memcpy_runs(b, 4).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    docker(&["stop", "-t", "0", &ctx.fleet.name("srv-a")])?;
    let ready_b = ctx
        .api
        .http
        .get(format!("{b}/readyz"))
        .send()
        .await?
        .status();
    ensure!(
        ready_b.is_success(),
        "srv-b not ready while srv-a is down: {ready_b}"
    );
    ctx.get_json(b, "/api/v1/runs")
        .await
        .context("srv-b serving while srv-a is down")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    docker(&["start", &ctx.fleet.name("srv-a")])?;
    ctx.all_succeed_once(&runs, Duration::from_secs(90)).await?;
    ctx.wait_ready("srv-a", Duration::from_secs(30)).await?;
    let a = ctx.url("srv-a")?;
    ctx.step("fault: replica restarted mid-upload, 12 results once each");
    Ok(a)
}

/// Fault 4: Postgres restarted under running work.
pub(crate) async fn fault_postgres_restarted(s: &Scenario<'_>) -> anyhow::Result<()> {
    let (ctx, a) = (s.ctx, &s.a);
    let mut runs = ctx.memcpy_runs(a, 2).await?;
    runs.push(
        ctx.start_run_with_env(a, "sleep", json!({"seconds": 3}), json!({}), &["node-1"])
            .await?,
    );
    docker(&["restart", "-t", "2", &ctx.fleet.name("pg")])?;
    for s in ["srv-a", "srv-b"] {
        ctx.wait_ready(s, Duration::from_secs(60))
            .await
            .with_context(|| format!("{s} after the Postgres restart"))?;
    }
    ctx.all_succeed_once(&runs, Duration::from_secs(90)).await?;
    ctx.step("fault: Postgres restarted, every result once");
    Ok(())
}
