//! What the CLI tests share: running the `heddle` binary, and playing an agent over the
//! agent protocol (the test kit's fake agent, by its credential) so that a server has
//! results to show.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use heddle_testkit::{Api, FakeAgent, TestServer};
use reqwest::Method;
use serde_json::Value;

/// Runs `heddle` against `url` with `token` and the config file `config`: its exit code,
/// stdout and stderr.
pub fn run_heddle(url: &str, token: &str, config: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args(args)
        .env("HEDDLE_URL", url)
        .env("HEDDLE_TOKEN", token)
        .env("HEDDLE_CONFIG", config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// Runs `heddle` with a config file of its own, so that calls share nothing but the server.
pub fn heddle_as(url: &str, token: &str, args: &[&str]) -> (i32, String, String) {
    run_heddle(
        url,
        token,
        &std::env::temp_dir().join(format!("heddle-cli-{}.json", uuid::Uuid::new_v4())),
        args,
    )
}

/// Runs `heddle` as the server's admin.
pub fn heddle(server: &TestServer, args: &[&str]) -> (i32, String, String) {
    heddle_as(&server.url, &server.admin_token, args)
}

/// Enrolls `hostname` with `token`; returns the agent's credential.
pub async fn enroll_with(server: &TestServer, token: &str, hostname: &str) -> String {
    FakeAgent::enrolled_with(&Api::new(server), token, hostname)
        .await
        .credential
}

/// Enrolls `hostname` with a fresh enrollment token; returns the agent's credential.
pub async fn enroll(server: &TestServer, hostname: &str) -> String {
    heddle_testkit::enroll(&Api::new(server), server, hostname)
        .await
        .credential
}

/// The agent's next job (its lease), or `None` when it has none queued.
pub async fn claim(server: &TestServer, credential: &str) -> Option<Value> {
    FakeAgent::with_credential(credential)
        .next_job(&Api::new(server))
        .await
}

/// Uploads `body` as the result of the job of `lease`.
pub async fn upload(server: &TestServer, credential: &str, lease: &Value, body: &Value) {
    let job = lease["job_id"].as_str().unwrap();
    FakeAgent::with_credential(credential)
        .upload(&Api::new(server), job, body.clone())
        .await;
}

/// `GET path` as the admin.
pub async fn get(server: &TestServer, path: &str) -> Value {
    Api::new(server)
        .ok(Method::GET, path, Some(&server.admin_token), None)
        .await
}
