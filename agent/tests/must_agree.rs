//! Per-node environments never split a communicator, and a hung multi-rank test is found,
//! stopped and named. Two real `heddle-agent run` processes (two "nodes" on this machine)
//! against a real server:
//!
//! - a node tuning profile that sets a must-agree variable on one node makes a run across
//!   both refused with a message that names the variable, each node's value and source and
//!   the fix; the same run with the value in its own env runs on both with that value;
//! - a two-node test that stops reporting (`sleep` with `silent_after_s`) is stopped by the
//!   agents' stall watch within its limit, reported `hung` with a verdict coded `hung`, and
//!   both nodes take the next job.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

mod lifecycle_support;

use std::time::{Duration, Instant};

use heddle_types::jobs::{JobState, Outcome, Run};
use lifecycle_support::*;
use serde_json::json;

const A: &str = "agree-a";
const B: &str = "agree-b";

async fn two_agents(
    server: &heddle_server::testing::TestServer,
    dir: &std::path::Path,
) -> (Agent, Agent) {
    let api = Api::new(server);
    let (ta, tb) = (
        server.enrollment_token().await,
        server.enrollment_token().await,
    );
    let a = Agent::start_named(A, &[&server.url], Some(&ta), &dir.join("a"), &[]);
    let b = Agent::start_named(B, &[&server.url], Some(&tb), &dir.join("b"), &[]);
    for (host, agent) in [(A, &a), (B, &b)] {
        eventually(&format!("{host} with facts"), agent, || async {
            api.fetch::<heddle_types::nodes::NodeDetail>(&format!("/nodes/{host}"))
                .await
                .filter(|n| n.facts.is_some())
        })
        .await;
    }
    (a, b)
}

async fn post(api: &Api, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = api
        .http
        .post(format!("{}/api/v1{path}", api.base))
        .bearer_auth(&api.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(json!(null)))
}

async fn wait_ended(api: &Api, id: uuid::Uuid, agent: &Agent) -> Run {
    eventually(&format!("run {id} ended"), agent, || async {
        api.run(id)
            .await
            .filter(|r| r.jobs.iter().all(|j| j.state.is_terminal()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_environment_is_refused_and_the_runs_own_value_goes_through() {
    let server = server(1).await;
    let api = Api::new(&server);
    let tmp = tempfile::tempdir().unwrap();
    let (_a, b) = two_agents(&server, tmp.path()).await;
    let (s, body) = post(
        &api,
        "/tuning-profiles",
        json!({"name": "b-one-channel", "node": B, "env": {"NCCL_MAX_NCHANNELS": "1"}}),
    )
    .await;
    assert_eq!(s, 201, "{body}");

    // The node's own profile makes its rank differ from the other's: refused before
    // anything is queued.
    let (s, body) = post(&api, "/runs", json!({"kind": "env", "nodes": [A, B]})).await;
    assert_eq!(s, 422, "{body}");
    let msg = body["message"].as_str().unwrap();
    for part in [
        "NCCL_MAX_NCHANNELS",
        &format!("{A} unset"),
        &format!("{B} \"1\" from tuning:b-one-channel"),
        "Set NCCL_MAX_NCHANNELS in the run's env",
        "site-wide tuning profile",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    let runs: Vec<Run> = api.fetch("/runs").await.unwrap();
    assert!(runs.is_empty(), "nothing was stored: {runs:?}");
    // An investigation over the same nodes would run the same split pair.
    let (s, body) = post(
        &api,
        "/investigations",
        json!({"kind": "nccl", "nodes": [A, B]}),
    )
    .await;
    assert_eq!(s, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("NCCL_MAX_NCHANNELS")
    );
    // One node alone has no one to disagree with.
    let (s, body) = post(&api, "/runs", json!({"kind": "env", "nodes": [B]})).await;
    assert_eq!(s, 201, "{body}");

    // The run's own env wins on every node: the run goes through, both ranks alike.
    let run = server
        .start_run(json!({"kind": "env", "nodes": [A, B], "env": {"NCCL_MAX_NCHANNELS": "1"}}))
        .await;
    let done = wait_ended(&api, run.id, &b).await;
    assert_eq!(done.state, "succeeded", "{done:?}");
    for job in &done.jobs {
        let v = job
            .applied_env
            .iter()
            .find(|e| e.name == "NCCL_MAX_NCHANNELS")
            .unwrap();
        assert_eq!((v.value.as_str(), v.source.as_str()), ("1", "run"));
    }
    for r in api.results(run.id).await {
        assert_eq!(
            r.summary["env"]["NCCL_MAX_NCHANNELS"], "1",
            "{}",
            r.hostname
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_pair_is_stopped_as_hung_and_both_nodes_take_the_next_job() {
    let server = server(1).await;
    let api = Api::new(&server);
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = two_agents(&server, tmp.path()).await;

    // Both ranks report for a second, then wait in silence for ten minutes: the stall
    // watch (2 s) must end them long before their wall-clock limit.
    let started = Instant::now();
    let run = server
        .start_run(
            json!({"kind": "sleep", "nodes": [A, B], "stall_s": 2, "timeout_s": 600,
            "params": {"seconds": 600, "silent_after_s": 1}}),
        )
        .await;
    let done = wait_ended(&api, run.id, &a).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(
        done.jobs.iter().all(|j| j.state == JobState::Failed),
        "{done:?}"
    );
    let results = eventually("both results judged", &b, || async {
        let r = api.results(run.id).await;
        (r.len() == 2 && r.iter().all(|r| r.verdict.is_some())).then_some(r)
    })
    .await;
    for r in &results {
        assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
        let reason = r.reason.as_deref().unwrap();
        assert!(reason.starts_with("hung: "), "{reason}");
        assert_eq!(r.summary["hung"]["stage"], "init", "{}", r.summary);
        let verdict = r.verdict.as_ref().unwrap();
        assert_eq!(verdict.verdict, heddle_types::health::Verdict::Fail);
        let first = &verdict.reasons[0];
        assert_eq!(first.code.as_deref(), Some("hung"), "{verdict:?}");
        assert!(first.message.contains("hung at init"), "{}", first.message);
        assert!(
            first.evidence.as_deref().unwrap().contains("agreed"),
            "{first:?}"
        );
    }
    // No test child is left holding anything, and both nodes take the next job.
    assert!(test_children(a.pid()).is_empty() && test_children(b.pid()).is_empty());
    let next = server
        .start_run(json!({"kind": "env", "nodes": [A, B]}))
        .await;
    let done = wait_ended(&api, next.id, &b).await;
    assert_eq!(done.state, "succeeded", "{done:?}");
}
