//! Taking over a node's identity, with real agent processes against a real server: a
//! second agent enrolling under a live node's host name must not replace it or get its
//! jobs until an admin says so.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::time::Instant;

use heddle_types::auth::PendingEnrollment;
use serde_json::json;

mod lifecycle_support;
use lifecycle_support::*;

async fn wait_exit(agent: &mut Agent) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < WAIT,
            "agent did not stop: {}",
            agent.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn pending(api: &Api, agent: &Agent) -> PendingEnrollment {
    eventually("a pending enrollment", agent, || async {
        api.fetch::<Vec<PendingEnrollment>>("/agents/pending")
            .await
            .and_then(|mut v| v.pop())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_agent_enrolling_live_hostname_does_not_take_its_jobs() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut live = enrolled_agent(&server, &dir.path().join("live")).await;
    let api = Api::new(&server);

    // Another machine with a valid enrollment token claims the live node's host name.
    let token = server.enrollment_token().await;
    let mut intruder = Agent::start(&[&server.url], Some(&token), &dir.path().join("intruder"));
    let waiting = pending(&api, &intruder).await;
    assert_eq!(waiting.hostname, HOST);
    eventually("the intruder is told to wait", &intruder, || async {
        intruder
            .log()
            .contains(&format!("heddle agents approve {}", waiting.id))
            .then_some(())
    })
    .await;

    // The node's work still goes to the live agent, which keeps running.
    let run = start_run(
        &server,
        json!({"kind": "memcpy", "params": {"max_bytes": 65536}}),
    )
    .await;
    api.wait_run(run, "succeeded", &live).await;
    assert!(live.child.try_wait().unwrap().is_none(), "{}", live.log());
    assert!(
        intruder.child.try_wait().unwrap().is_none(),
        "a waiting agent keeps asking: {}",
        intruder.log()
    );
    assert!(!intruder.state_dir.join("identity.json").exists());

    // Rejected: the intruder stops with status 3 and says why; the live agent stays.
    assert_eq!(
        api.send(
            reqwest::Method::POST,
            &format!("/agents/pending/{}/reject", waiting.id)
        )
        .await,
        200
    );
    let status = wait_exit(&mut intruder).await;
    assert_eq!(status.code(), Some(6), "{}", intruder.log());
    assert!(intruder.log().contains("rejected"), "{}", intruder.log());
    assert!(!intruder.state_dir.join("identity.json").exists());
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 1}})).await;
    api.wait_run(run, "succeeded", &live).await;
    assert!(live.child.try_wait().unwrap().is_none(), "{}", live.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_agent_replaces_the_live_one_and_survives_a_restart_while_waiting() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut old = enrolled_agent(&server, &dir.path().join("old")).await;
    let api = Api::new(&server);

    // The host was rebuilt: its new agent waits, and is restarted while it waits (the
    // ticket in its state directory is used again; the spent token is not needed).
    let token = server.enrollment_token().await;
    let state = dir.path().join("new");
    let mut new = Agent::start(&[&server.url], Some(&token), &state);
    let waiting = pending(&api, &new).await;
    eventually("the ticket is kept", &new, || async {
        state.join("pending-enrollment.json").exists().then_some(())
    })
    .await;
    new.sigkill();
    let new = Agent::start(&[&server.url], None, &state);
    eventually("the restarted agent waits again", &new, || async {
        new.log().contains("waiting for approval").then_some(())
    })
    .await;

    assert_eq!(
        api.send(
            reqwest::Method::POST,
            &format!("/agents/pending/{}/approve", waiting.id)
        )
        .await,
        200
    );
    eventually("the new agent enrolled", &new, || async {
        state.join("identity.json").exists().then_some(())
    })
    .await;
    assert!(!state.join("pending-enrollment.json").exists());
    let status = wait_exit(&mut old).await;
    assert_eq!(
        status.code(),
        Some(6),
        "the replaced agent stops: {}",
        old.log()
    );
    let run = start_run(
        &server,
        json!({"kind": "memcpy", "params": {"max_bytes": 65536}}),
    )
    .await;
    api.wait_run(run, "succeeded", &new).await;
}
