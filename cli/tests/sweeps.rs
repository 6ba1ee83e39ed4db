//! `heddle runs sweep` against a real server, on a sweep result uploaded through the agent
//! protocol: the table, `--json`, and `--keep` storing the winner as a tuning profile.

use std::process::Command;

use heddle_server::testing::TestServer;
use serde_json::{Value, json};

fn heddle(server: &TestServer, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args(args)
        .env("HEDDLE_URL", &server.url)
        .env("HEDDLE_TOKEN", &server.admin_token)
        .env("HEDDLE_CONFIG", std::env::temp_dir().join(format!("heddle-cli-sweep-{}.json", uuid::Uuid::new_v4())))
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_sweep_shows_winners_and_keeps_one() {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    let token = server.enrollment_token().await;
    let enrolled: Value = http
        .post(format!("{}/api/v1/agent/enroll", server.url))
        .json(&json!({"enroll_token": token, "hostname": "sweep-cli"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cred = enrolled["credential"].as_str().unwrap().to_string();
    let run = server
        .start_run(json!({"kind": "sweep", "nodes": ["sweep-cli"], "params": {"grid": {"NCCL_PROTO": ["Simple", "LL"]}}}))
        .await;
    let lease: Value = http.post(format!("{}/api/v1/agent/jobs/claim", server.url)).bearer_auth(&cred).send().await.unwrap().json().await.unwrap();
    let mut rows = Vec::new();
    for (proto, small, large) in [("Simple", 0.5, 301.8), ("LL", 0.9, 120.4)] {
        for (size, busbw) in [(1024u64, small), (256u64 << 20, large)] {
            rows.push(json!({"size_bytes": size, "time_us": 10.0, "algbw_gbs": busbw, "busbw_gbs": busbw, "wrong": 0,
                "labels": {"NCCL_PROTO": proto}}));
        }
    }
    let resp = http
        .post(format!("{}/api/v1/agent/jobs/{}/result", server.url, lease["job_id"].as_str().unwrap()))
        .bearer_auth(&cred)
        .json(&json!({"upload_key": "cli-sweep", "outcome": "succeeded", "summary": {}, "rows": rows,
            "started_at": "2026-11-23T10:00:00Z", "finished_at": "2026-11-23T10:01:00Z"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let id = run.id.to_string();

    let (code, out, err) = heddle(&server, &["runs", "sweep", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("NCCL_PROTO=Simple") && out.contains("301.80"), "{out}");
    let small = out.lines().find(|l| l.contains("small")).unwrap_or_else(|| panic!("{out}"));
    assert!(small.contains("NCCL_PROTO=LL") && small.contains("0.90") && small.contains("0.50"), "{out}");

    let (code, out, err) = heddle(&server, &["runs", "sweep", &id, "--json"]);
    assert_eq!(code, 0, "{err}");
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["winners"][1]["band"], "large");
    assert_eq!(t["winners"][1]["env"]["NCCL_PROTO"], "Simple");

    let (code, out, err) = heddle(&server, &["runs", "sweep", &id, "--keep", "simple-large"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kept tuning profile simple-large") && out.contains("NCCL_PROTO=Simple"), "{out}");
    let (code, _, err) = heddle(&server, &["runs", "sweep", &id, "--keep", "simple-large"]);
    assert_ne!(code, 0);
    assert!(err.contains("already exists"), "{err}");
    let (code, _, err) = heddle(&server, &["runs", "sweep", &id, "--keep", "x", "--band", "huge"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown band"), "{err}");
}
