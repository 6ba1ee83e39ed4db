//! The agent's life cycle under faults: the server stopped and restarted on the same
//! address and database, the agent SIGKILLed and restarted, results spooled meanwhile.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::time::Duration;

use heddle_types::jobs::JobState;
use heddle_types::nodes::NodeDetail;
use serde_json::json;

mod lifecycle_support;
use lifecycle_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_spooled_while_server_is_down_is_uploaded_once() {
    // A long lease (heartbeat 5 s, lease 7.5 s) so the outage does not requeue the job.
    let server = server(5).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 2}})).await;
    api.wait_job(run, JobState::Running, &agent).await;

    let (db, url, addr) = stop_keeping_db(server).await;
    let spooled = eventually("result spooled", &agent, || async {
        let e = agent.spool_entries();
        (e.len() == 1).then_some(e)
    })
    .await;
    let entry: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&spooled[0]).unwrap()).unwrap();
    assert_eq!(entry["upload"]["outcome"], "succeeded");
    // Uploads fail for a while; the entry stays.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.spool_entries(), spooled);

    let server = restart(db, &url, addr, 5).await;
    let api2 = Api::new(&server);
    api2.wait_run(run, "succeeded", &agent).await;
    eventually("empty spool", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    let results = api2.results(run).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].summary["kind"], "sleep");
    assert!(
        agent
            .log()
            .contains("result upload failed; it stays spooled")
    );
    drop(api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_with_a_spooled_result_uploads_it_once_after_restart() {
    let server = server(5).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 1}})).await;
    api.wait_job(run, JobState::Running, &agent).await;

    // The result is spooled while the server is away; then the agent dies.
    let (db, url, addr) = stop_keeping_db(server).await;
    let spooled = eventually("result spooled", &agent, || async {
        let e = agent.spool_entries();
        (e.len() == 1).then_some(e)
    })
    .await;
    let saved = std::fs::read(&spooled[0]).unwrap();
    agent.sigkill();
    assert_eq!(agent.spool_entries(), spooled, "the spool survives SIGKILL");

    let server = restart(db, &url, addr, 5).await;
    let api2 = Api::new(&server);
    let agent = Agent::start(&[&server.url], None, &state);
    api2.wait_run(run, "succeeded", &agent).await;
    eventually("empty spool", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    assert_eq!(api2.results(run).await.len(), 1);

    // A crash between the server's acknowledgement and the removal of the file means the
    // entry is sent again: its key makes that a no-op.
    drop(agent);
    std::fs::write(&spooled[0], &saved).unwrap();
    let agent = Agent::start(&[&server.url], None, &state);
    eventually("re-sent entry acknowledged", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    assert!(
        agent.log().contains("result was already stored (retry)"),
        "{}",
        agent.log()
    );
    assert_eq!(api2.results(run).await.len(), 1);
    drop(api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_run_leaves_no_orphan_and_the_job_is_retried() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 3}})).await;
    api.wait_job(run, JobState::Running, &agent).await;
    let child = test_children(agent.pid());
    assert_eq!(child.len(), 1);
    agent.sigkill();
    eventually("orphaned child killed", &agent, || async {
        is_dead(child[0]).then_some(())
    })
    .await;

    // The lease lapses, the job is requeued, and the restarted agent runs it again.
    let agent = Agent::start(&[&server.url], None, &state);
    let done = api.wait_run(run, "succeeded", &agent).await;
    assert_eq!(done.jobs[0].attempts, 2);
    assert_eq!(api.results(run).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_an_unreachable_server_instead_of_exiting() {
    let server = server(1).await;
    let token = server.enrollment_token().await;
    let (db, url, addr) = stop_keeping_db(server).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(
        &[&format!("http://{addr}")],
        Some(&token),
        &dir.path().join("state"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "agent exited: {}",
        agent.log()
    );
    assert!(agent.log().contains("cannot enroll yet"), "{}", agent.log());

    let server = restart(db, &url, addr, 1).await;
    let api = Api::new(&server);
    eventually("node with facts", &agent, || async {
        api.fetch::<NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| n.facts.is_some())
    })
    .await;
}

/// Gone, or a zombie nobody reaped yet.
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => matches!(
            stat.rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next(),
            Some("Z" | "X")
        ),
    }
}
