//! The agent when its disk refuses the spool (full, read-only, gone): the result is held in
//! memory, the log says so, and it is uploaded once the server answers, exactly once.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::time::Duration;

use heddle_types::jobs::JobState;
use serde_json::json;

mod lifecycle_support;
use lifecycle_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_disk_refuses_is_held_in_memory_and_uploaded_once() {
    // A long lease (heartbeat 5 s, lease 7.5 s) so the outage does not requeue the job.
    let server = server(5).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 2}})).await;
    api.wait_job(run, JobState::Running, &agent).await;

    // The spool directory vanishes under the agent, so every write to it fails (as on a
    // full or read-only disk), and the server goes away too.
    let spool = state.join("spool");
    let aside = state.join("spool.aside");
    std::fs::rename(&spool, &aside).unwrap();
    let (db, url, addr) = stop_keeping_db(server).await;
    eventually("the result held in memory", &agent, || async {
        agent
            .log()
            .contains("cannot spool the result (disk full or read-only?); keeping it in memory")
            .then_some(())
    })
    .await;
    eventually("an upload from memory tried", &agent, || async {
        agent
            .log()
            .contains("result upload failed; it stays in memory")
            .then_some(())
    })
    .await;
    assert!(!spool.exists() && std::fs::read_dir(&aside).unwrap().count() == 0);

    let server = restart(db, &url, addr, 5).await;
    let api2 = Api::new(&server);
    api2.wait_run(run, "succeeded", &agent).await;
    assert_eq!(api2.results(run).await.len(), 1);

    // The disk is back: the next result goes through the spool again, and leaves it.
    std::fs::rename(&aside, &spool).unwrap();
    let run2 = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 1}})).await;
    api2.wait_run(run2, "succeeded", &agent).await;
    assert_eq!(api2.results(run2).await.len(), 1);
    eventually("empty spool", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(api2.results(run).await.len(), 1, "nothing sent twice");
    drop(api);
}
