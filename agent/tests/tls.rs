//! The `heddle-agent run` binary against a real server serving HTTPS with a certificate
//! from a private CA made here: refused with a wrong pin or without the CA (and the log
//! says what to do), then enrolled, reporting facts and running a job with both.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::time::{Duration, Instant};

use heddle_server::testing::TestServer;
use heddle_tls::test_ca::TestCa;
use heddle_types::nodes::NodeDetail;
use serde_json::json;

mod lifecycle_support;
use lifecycle_support::*;

/// Waits until the agent's log contains `needle`; fails with the log otherwise.
async fn wait_for_log(agent: &Agent, needle: &str) -> String {
    let start = Instant::now();
    loop {
        let log = agent.log();
        if log.contains(needle) {
            return log;
        }
        assert!(
            start.elapsed() < WAIT,
            "no {needle:?} in the agent's log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_talks_https_with_a_private_ca_and_a_pinned_key() {
    let ca = TestCa::new();
    let files = ca.write_server_files("localhost");
    let server = TestServer::start_https(&files, |c| c.heartbeat_interval_s = 1).await;
    assert!(
        server.url.starts_with("https://localhost:"),
        "{}",
        server.url
    );
    let token = server.enrollment_token().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ca_file = files.ca.to_str().unwrap();
    let pin = files.issued.pin().to_string();

    // A key other than the server's: refused, however valid the certificate.
    let other_key = ca.issue("localhost").pin().to_string();
    let mut agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &state,
        &["--ca-file", ca_file, "--pin-sha256", &other_key],
    );
    let log = wait_for_log(&agent, "not a pinned key").await;
    assert!(log.contains(&pin), "the log names the key found: {log}");
    assert!(log.contains("HEDDLE_SERVER_PIN"), "{log}");
    assert!(
        !state.join("identity.json").exists(),
        "enrolled despite the pin"
    );
    agent.sigkill();

    // The system's roots only: the private CA is unknown.
    let mut agent = Agent::start(&[&server.url], Some(&token), &state);
    let log = wait_for_log(&agent, "not signed by a CA this client trusts").await;
    assert!(log.contains("--ca-file"), "{log}");
    assert!(
        !state.join("identity.json").exists(),
        "enrolled without the CA"
    );
    agent.sigkill();

    // The CA and the right pin: enrolls, reports facts, runs a job and uploads its result.
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &state,
        &["--ca-file", ca_file, "--pin-sha256", &pin],
    );
    let api = Api::new(&server);
    eventually("node with facts over HTTPS", &agent, || async {
        api.fetch::<NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| n.facts.is_some())
    })
    .await;
    let run = start_run(
        &server,
        json!({"kind": "sleep", "params": {"seconds": 0.1}}),
    )
    .await;
    api.wait_run(run, "succeeded", &agent).await;
    assert_eq!(api.results(run).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_for_plain_http_is_refused_at_start() {
    let ca = TestCa::new();
    let pin = ca.issue("localhost").pin().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_heddle-agent"))
        .args([
            "run",
            "--server",
            "http://127.0.0.1:9",
            "--enroll-token",
            "x",
        ])
        .args(["--state-dir", dir.path().join("state").to_str().unwrap()])
        .args(["--pin-sha256", &pin])
        .env_remove("HEDDLE_SERVER")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("use https:// URLs"), "{stderr}");
}
