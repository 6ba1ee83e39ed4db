//! What the CLI tests share: running the `heddle` binary, and playing an agent over the
//! agent protocol so that a server has results to show.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use heddle_server::testing::TestServer;
use serde_json::{Value, json};

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
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/agent/enroll", server.url))
        .json(&json!({"enroll_token": token, "hostname": hostname}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "enrolling {hostname}");
    let enrolled: Value = resp.json().await.unwrap();
    enrolled["credential"].as_str().unwrap().to_string()
}

/// Enrolls `hostname` with a fresh enrollment token; returns the agent's credential.
pub async fn enroll(server: &TestServer, hostname: &str) -> String {
    let token = server.enrollment_token().await;
    enroll_with(server, &token, hostname).await
}

/// The agent's next job (its lease), or `None` when it has none queued.
pub async fn claim(server: &TestServer, credential: &str) -> Option<Value> {
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/agent/jobs/claim", server.url))
        .bearer_auth(credential)
        .send()
        .await
        .unwrap();
    if resp.status() == 204 {
        return None;
    }
    Some(resp.json().await.unwrap())
}

/// Uploads `body` as the result of the job of `lease`.
pub async fn upload(server: &TestServer, credential: &str, lease: &Value, body: &Value) {
    let job = lease["job_id"].as_str().unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/agent/jobs/{job}/result", server.url))
        .bearer_auth(credential)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    assert_eq!(
        status,
        201,
        "uploading the result of job {job}: {}",
        resp.text().await.unwrap_or_default()
    );
}

/// `GET path` as the admin.
pub async fn get(server: &TestServer, path: &str) -> Value {
    reqwest::Client::new()
        .get(format!("{}{path}", server.url))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
