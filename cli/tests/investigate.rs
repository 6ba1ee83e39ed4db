//! `heddle investigate` against a real server: agents driven over the agent protocol
//! report a slow node; the CLI starts the investigation, shows the matrix and the culprit,
//! and `--watch` exits 1 because a culprit was named.

mod common;

use std::time::Duration;

use common::{claim, enroll, get, heddle, upload};
use heddle_server::testing::TestServer;
use serde_json::{Value, json};

/// Claims and answers every queued job of the agents (their credentials) until the investigation is done.
/// Pairs with `slow` report a quarter of the bandwidth.
async fn serve_jobs(server: &TestServer, agents: &[String], slow: &str, investigation: &str) {
    for _ in 0..200 {
        for cred in agents {
            let Some(lease) = claim(server, cred).await else {
                continue;
            };
            let run = get(
                server,
                &format!("/api/v1/runs/{}", lease["run_id"].as_str().unwrap()),
            )
            .await;
            let involved = run["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|j| j["hostname"] == slow);
            let bw = if involved { 40.0 } else { 160.0 };
            let body = json!({"upload_key": format!("k-{}", lease["job_id"].as_str().unwrap()), "outcome": "succeeded",
                "rows": [{"size_bytes": 1 << 26, "busbw_gbs": bw}],
                "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
            upload(server, cred, &lease, &body).await;
        }
        let inv = get(server, &format!("/api/v1/investigations/{investigation}")).await;
        if inv["state"] != "running" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("investigation {investigation} did not finish");
}

#[tokio::test(flavor = "multi_thread")]
async fn investigate_start_show_and_watch() {
    let server = TestServer::start().await;
    let mut agents = Vec::new();
    for host in ["inv-a", "inv-b", "inv-c", "inv-d"] {
        agents.push(enroll(&server, host).await);
    }
    let (code, out, err) = heddle(
        &server,
        &[
            "investigate",
            "start",
            "--nodes",
            "inv-a,inv-b,inv-c,inv-d",
            "--kind",
            "nccl",
            "--param",
            "op=all_gather",
            "--batch",
            "2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("(6 pairs)"), "{err}");
    let id = out.trim().to_string();
    serve_jobs(&server, &agents, "inv-c", &id).await;

    let (code, table, err) = heddle(&server, &["investigate", "show", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("busbw_gbs (GB/s)"), "{table}");
    assert!(table.contains("160.0") && table.contains("40.0"), "{table}");
    assert!(table.contains("verdict: culprit"), "{table}");
    assert!(table.contains("node inv-c is bad"), "{table}");
    let (code, json, _) = heddle(&server, &["investigate", "show", &id, "--json"]);
    assert_eq!(code, 0);
    let inv: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(inv["analysis"]["culprits"][0]["members"], json!(["inv-c"]));
    assert_eq!(inv["params"]["op"], "all_gather");
    let (code, _, err) = heddle(&server, &["investigate", "show", &id, "--watch"]);
    assert_eq!(code, 1, "a named culprit exits 1: {err}");
    let (code, list, _) = heddle(&server, &["investigate", "ls"]);
    assert_eq!(code, 0);
    assert!(list.contains(&id) && list.contains("inv-c"), "{list}");
    let (code, _, err) = heddle(
        &server,
        &["investigate", "start", "--nodes", "inv-a", "--kind", "nccl"],
    );
    assert_eq!(code, 5, "a refused request exits 5");
    assert!(err.contains("nodes must list 2 to 64 nodes"), "{err}");
}
