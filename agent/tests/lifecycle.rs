//! The agent's life cycle against a real server and Postgres, in normal operation: the
//! `heddle-agent run` binary is started as a process and driven through the admin API.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use heddle_server::testing::TestServer;
use heddle_types::auth::AgentInfo;
use heddle_types::jobs::{JobState, Outcome};
use heddle_types::nodes::NodeDetail;
use serde_json::json;
use uuid::Uuid;

mod lifecycle_support;
use lifecycle_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolls_once_heartbeats_and_reports_facts() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("identity.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "credential file must be private");
    let agent_id: Uuid = agent.identity()["agent_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let node: NodeDetail = api.fetch(&format!("/nodes/{HOST}")).await.unwrap();
    assert_eq!(node.facts.as_ref().unwrap()["host"]["hostname"], HOST);
    assert_eq!(node.facts_sha256.as_ref().unwrap().len(), 64);

    // Heartbeats keep arriving.
    let first = heartbeat_of(&api, agent_id).await;
    eventually("a later heartbeat", &agent, || async {
        (heartbeat_of(&api, agent_id).await > first).then_some(())
    })
    .await;

    // A restart reuses the stored credential: no second enrollment (which would revoke
    // the first agent), even without a token.
    agent.sigkill();
    let agent = Agent::start(&[&server.url], None, &state);
    let before = heartbeat_of(&api, agent_id).await;
    eventually("heartbeat after restart", &agent, || async {
        (heartbeat_of(&api, agent_id).await > before).then_some(())
    })
    .await;
    let agents: Vec<AgentInfo> = api.fetch("/agents").await.unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert!(agents[0].revoked_at.is_none());
    assert!(agent.log().contains("using the stored credential"));
    // Unchanged facts are not stored again: each stored snapshot differs from the one
    // before it. (The facts are this host's own, so a network interface that comes or goes
    // meanwhile, e.g. a container's, is a real change and a second snapshot.)
    let history: Vec<serde_json::Value> = api
        .fetch(&format!("/nodes/{HOST}/facts/history"))
        .await
        .unwrap();
    assert!(!history.is_empty(), "no facts stored");
    let shas: Vec<&str> = history
        .iter()
        .map(|h| h["facts_sha256"].as_str().expect("facts_sha256"))
        .collect();
    assert!(
        shas.windows(2).all(|w| w[0] != w[1]),
        "the same facts were stored twice in a row: {shas:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcpy_result_arrives_once() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let run = start_run(
        &server,
        json!({"kind": "memcpy", "params": {"min_bytes": 1024, "max_bytes": 1048576, "factor": 4, "iters": 5}}),
    )
    .await;
    api.wait_run(run, "succeeded", &agent).await;
    let results = api.results(run).await;
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.exit_code, Some(0));
    let sizes: Vec<i64> = r.rows.iter().map(|row| row.size_bytes).collect();
    assert_eq!(sizes, vec![1024, 4096, 16384, 65536, 262144, 1048576]);
    for row in &r.rows {
        let (t, bw) = (row.time_us.unwrap(), row.algbw_gbs.unwrap());
        assert!(t > 0.0 && bw > 0.0);
        assert!((bw - row.size_bytes as f64 / t / 1e3).abs() / bw < 1e-6);
        assert_eq!(row.wrong, Some(0));
    }
    assert_eq!(r.summary["kind"], "memcpy");
    assert!(r.finished_at >= r.started_at);
    eventually("empty spool", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    // Nothing else arrives later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(api.results(run).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_timeout_and_unknown_kind_are_reported() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);

    let fail = start_run(
        &server,
        json!({"kind": "fail", "params": {"message": "link flapped", "exit_code": 7}}),
    )
    .await;
    api.wait_run(fail, "failed", &agent).await;
    let r = &api.results(fail).await[0];
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.exit_code, Some(7));
    assert_eq!(
        r.reason.as_deref(),
        Some("exited with status 7: link flapped")
    );
    assert!(r.stderr_tail.as_deref().unwrap().contains("link flapped"));

    let slow = start_run(
        &server,
        json!({"kind": "sleep", "params": {"seconds": 60}, "timeout_s": 1}),
    )
    .await;
    api.wait_run(slow, "failed", &agent).await;
    let r = &api.results(slow).await[0];
    assert_eq!(r.reason.as_deref(), Some("timed out after 1 s"));
    let took = (r.finished_at - r.started_at).to_std().unwrap();
    assert!(took < Duration::from_secs(10), "{took:?}");

    // The server refuses kinds it does not know; a job of a kind this agent lacks (a newer
    // server's) reaches it only from the database: it is skipped, not run.
    let odd = Uuid::new_v4();
    sqlx::query(
        "WITH r AS (INSERT INTO runs (id, label, spec, created_by)
                    SELECT $1, 'odd', jsonb_set(spec, '{kind}', '\"warp-drive\"'), created_by
                    FROM runs WHERE id = $2 RETURNING id)
         INSERT INTO jobs (id, run_id, node_id, rank, world_size, state, max_attempts)
         SELECT $3, (SELECT id FROM r), node_id, 0, 1, 'queued', 3 FROM jobs WHERE run_id = $2",
    )
    .bind(odd)
    .bind(slow)
    .bind(Uuid::new_v4())
    .execute(&server.state.db)
    .await
    .unwrap();
    api.wait_run(odd, "skipped", &agent).await;
    let r = &api.results(odd).await[0];
    assert_eq!(r.outcome, Outcome::Skipped);
    assert_eq!(
        r.reason.as_deref(),
        Some("unsupported job kind: warp-drive")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_kills_the_child() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let run = start_run(
        &server,
        json!({"kind": "sleep", "params": {"seconds": 120}}),
    )
    .await;
    let running = api.wait_job(run, JobState::Running, &agent).await;
    // Progress travels with the renewals.
    eventually("progress", &agent, || async {
        api.run(run).await.and_then(|r| r.jobs[0].progress.clone())
    })
    .await;
    assert!(running.jobs[0].started_at.is_some());
    let children = test_children(agent.pid());
    assert_eq!(children.len(), 1, "one test child expected");

    assert_eq!(
        api.send(reqwest::Method::POST, &format!("/runs/{run}/cancel"))
            .await,
        200
    );
    api.wait_run(run, "cancelled", &agent).await;
    let results = eventually("cancelled result", &agent, || async {
        let r = api.results(run).await;
        (!r.is_empty()).then_some(r)
    })
    .await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].outcome, Outcome::Cancelled);
    eventually("child gone", &agent, || async {
        test_children(agent.pid()).is_empty().then_some(())
    })
    .await;
    assert!(
        !Path::new(&format!("/proc/{}", children[0])).exists()
            || test_children(agent.pid()).is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_over_to_a_second_replica() {
    let primary = server(1).await;
    let replica =
        TestServer::start_on(&primary.database_url(), |c| c.heartbeat_interval_s = 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token = primary.enrollment_token().await;
    let agent = Agent::start(
        &[&primary.url, &replica.url],
        Some(&token),
        &dir.path().join("state"),
    );
    let api = Api::new(&replica);
    eventually("node with facts", &agent, || async {
        api.fetch::<NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| n.facts.is_some())
    })
    .await;
    let db = primary.db.clone();
    primary.stop().await;
    let run = start_run(
        &replica,
        json!({"kind": "memcpy", "params": {"max_bytes": 65536}}),
    )
    .await;
    api.wait_run(run, "succeeded", &agent).await;
    assert_eq!(api.results(run).await.len(), 1);
    assert!(agent.log().contains("switched to server replica"));
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_agent_stops_with_status_3() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let agent_id = agent.identity()["agent_id"].as_str().unwrap().to_string();
    assert_eq!(
        api.send(reqwest::Method::DELETE, &format!("/agents/{agent_id}"))
            .await,
        204
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = agent.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < WAIT,
            "agent did not stop: {}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(6), "{}", agent.log());
    assert!(
        agent.log().contains("refused this agent's credential"),
        "{}",
        agent.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_jobs_in_parallel_up_to_the_limit() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let token = server.enrollment_token().await;
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &dir.path().join("state"),
        &["--max-parallel", "2"],
    );
    let api = Api::new(&server);
    eventually("node", &agent, || async {
        api.fetch::<NodeDetail>(&format!("/nodes/{HOST}")).await
    })
    .await;
    let runs: Vec<Uuid> = start_sleep_runs(&server, 3).await;
    // Two children at once, never three.
    let mut most = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        let n = test_children(agent.pid()).len();
        assert!(n <= 2, "{n} children with --max-parallel 2");
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(most, 2);
    for run in runs {
        api.wait_run(run, "succeeded", &agent).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_facts_are_sent_again() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    // A copy of a fixture tree stands in for the node, so the test can change it.
    let root = dir.path().join("root");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ethernet-box");
    let cp = Command::new("cp")
        .args(["-a", fixture])
        .arg(&root)
        .status()
        .unwrap();
    assert!(cp.success());
    let token = server.enrollment_token().await;
    let root_arg = root.to_str().unwrap();
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &dir.path().join("state"),
        &["--facts-root", root_arg, "--facts-interval", "300ms"],
    );
    let api = Api::new(&server);
    let history = |n: usize| {
        let api = &api;
        async move {
            api.fetch::<Vec<serde_json::Value>>(&format!("/nodes/{HOST}/facts/history"))
                .await
                .filter(|h| h.len() == n)
        }
    };
    eventually("first facts", &agent, || history(1)).await;
    // Re-collections of unchanged facts send nothing new.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        history(1).await.is_some(),
        "unchanged facts were stored again"
    );

    std::fs::write(
        root.join("proc/sys/kernel/osrelease"),
        "6.99.0-heddle-test\n",
    )
    .unwrap();
    eventually("changed facts", &agent, || history(2)).await;
    let node: NodeDetail = api.fetch(&format!("/nodes/{HOST}")).await.unwrap();
    assert_eq!(node.facts.unwrap()["host"]["kernel"], "6.99.0-heddle-test");
}

async fn heartbeat_of(api: &Api, agent_id: Uuid) -> chrono::DateTime<chrono::Utc> {
    let agents: Vec<AgentInfo> = api.fetch("/agents").await.unwrap();
    agents
        .iter()
        .find(|a| a.id == agent_id)
        .unwrap()
        .last_heartbeat_at
        .unwrap()
}

async fn start_sleep_runs(server: &TestServer, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(start_run(server, json!({"kind": "sleep", "params": {"seconds": 3}})).await);
    }
    ids
}
