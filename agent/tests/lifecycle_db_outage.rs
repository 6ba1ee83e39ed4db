//! The agent through an outage of the server's database (a private Postgres stopped for
//! several lease terms): the server answers 503 with Retry-After; the agent keeps its
//! running child, spools the result of a job that ends meanwhile, and once the database is
//! back the job is still its own (never requeued) and each result is stored once.

use std::time::{Duration, Instant};

use heddle_server::testing::TestServer;
use heddle_server::testing::private_pg::PrivatePostgres;
use heddle_types::jobs::JobState;
use serde_json::json;

mod lifecycle_support;
use lifecycle_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_kills_no_child_and_loses_no_result() {
    let pg = PrivatePostgres::start();
    // Heartbeat 1 s: leases of 1.5 s, so the 8 s outage outlasts five of them.
    let server = TestServer::start_on(&pg.url(), |c| c.heartbeat_interval_s = 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token = server.enrollment_token().await;
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &dir.path().join("state"),
        &["--max-parallel", "2"],
    );
    let api = Api::new(&server);
    eventually("node with facts", &agent, || async {
        api.fetch::<heddle_types::nodes::NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| n.facts.is_some())
    })
    .await;
    // One job ends during the outage, one runs through it.
    let short = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 4}})).await;
    let long = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 16}})).await;
    api.wait_job(short, JobState::Running, &agent).await;
    api.wait_job(long, JobState::Running, &agent).await;
    let children = test_children(agent.pid());
    assert_eq!(children.len(), 2, "two children: {children:?}");

    pg.stop();
    let down = Instant::now();
    let spooled = eventually("the short job's result spooled", &agent, || async {
        let e = agent.spool_entries();
        (e.len() == 1).then_some(e)
    })
    .await;
    // The outage lasts at least 8 s, and until an upload of the spooled result has failed:
    // a request may wait out the server's pool timeout (5 s) before it is answered 503.
    eventually("a failed upload of the spooled result", &agent, || async {
        agent
            .log()
            .contains("result upload failed; it stays spooled")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(down.elapsed())).await;
    // The long job's child lives on; the result is still on disk.
    let alive = test_children(agent.pid());
    assert_eq!(alive.len(), 1, "the long job's child runs on: {alive:?}");
    assert!(children.contains(&alive[0]));
    assert_eq!(agent.spool_entries(), spooled);
    pg.resume();

    let short_run = api.wait_run(short, "succeeded", &agent).await;
    let long_run = api.wait_run(long, "succeeded", &agent).await;
    for run in [&short_run, &long_run] {
        assert_eq!(run.jobs[0].attempts, 1, "not requeued: {run:?}");
        assert_eq!(api.results(run.id).await.len(), 1, "one result: {run:?}");
    }
    eventually("empty spool", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    let log = agent.log();
    assert!(log.contains("503"), "the agent saw the 503s");
    assert!(log.contains("lease renewal failed; the child keeps running"));
    assert!(!log.contains("lease lost"), "no lease was lost:\n{log}");
    assert!(!log.contains("server asks to stop a job"), "{log}");
    server.stop().await;
}
