//! `heddle preflight` exit codes against a real server: 0 pass, 1 fail, 2 warn, 7 no
//! verdict, and 3 and up when it could not ask.

mod common;

use common::{claim, enroll, heddle_as, upload};
use heddle_server::testing::TestServer;
use serde_json::{Value, json};

async fn call(server: &TestServer, path: &str, bearer: &str, body: Value) -> Value {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", server.url))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.json().await.unwrap_or(Value::Null)
}

/// An enrolled node with a memcpy result of `gbs` for each figure in `history`.
async fn node_with_history(server: &TestServer, host: &str, history: &[f64]) {
    let cred = enroll(server, host).await;
    for (i, gbs) in history.iter().enumerate() {
        server
            .start_run(json!({"kind": "memcpy", "nodes": [host]}))
            .await;
        let lease = claim(server, &cred).await.expect("the memcpy job");
        let body = json!({"upload_key": format!("{host}-{i}"), "outcome": "succeeded",
            "rows": [{"size_bytes": 64 << 20, "op": "memcpy", "algbw_gbs": gbs, "wrong": 0}],
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
        upload(server, &cred, &lease, &body).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_exit_codes() {
    let server = TestServer::start().await;
    let (url, admin) = (server.url.clone(), server.admin_token.clone());
    // An operator expectation of 10 GB/s; `good` clears it, `bad` does not, `slow` clears it
    // but fell 20 % below its own baseline.
    call(&server, "/api/v1/expectations", &admin, json!({"test": "memcpy", "metric": "algbw_gbs", "value": 10.0, "source": "site acceptance"})).await;
    node_with_history(&server, "good", &[12.0]).await;
    node_with_history(&server, "bad", &[8.0]).await;
    node_with_history(&server, "slow", &[15.0, 15.0, 15.0, 12.0]).await;
    node_with_history(&server, "new", &[]).await;
    let pf = |nodes: &str| {
        let (url, admin, nodes) = (url.clone(), admin.clone(), nodes.to_string());
        move || {
            heddle_as(
                &url,
                &admin,
                &[
                    "preflight",
                    "--nodes",
                    &nodes,
                    "--check",
                    "memcpy",
                    "--max-age",
                    "1h",
                    "--wait",
                    "0",
                ],
            )
        }
    };
    let run = |f: Box<dyn FnOnce() -> (i32, String, String) + Send>| tokio::task::spawn_blocking(f);

    let (code, out, err) = run(Box::new(pf("good"))).await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("preflight memcpy: PASS"), "{out}");
    let (code, out, _) = run(Box::new(pf("good,slow"))).await.unwrap();
    assert_eq!(code, 2, "warn: {out}");
    let (code, out, _) = run(Box::new(pf("good,slow,bad"))).await.unwrap();
    assert_eq!(code, 1, "fail: {out}");
    assert!(out.contains("below the expected"), "{out}");
    let (code, out, _) = run(Box::new(pf("good,new"))).await.unwrap();
    assert_eq!(code, 7, "no verdict for `new` and no wait: {out}");
    let (code, _, err) = run(Box::new(pf("nosuchnode"))).await.unwrap();
    assert_eq!(code, 5, "an unknown node is a refused request: {err}");
    assert!(err.contains("could not decide"), "{err}");

    let (url2, admin2) = (url.clone(), admin.clone());
    let (code, out, _) = tokio::task::spawn_blocking(move || {
        heddle_as(
            &url2,
            &admin2,
            &[
                "preflight",
                "--nodes",
                "bad",
                "--check",
                "memcpy",
                "--wait",
                "0",
                "--json",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["verdict"].as_str(), v["nodes"][0]["from"].as_str()),
        (Some("fail"), Some("history"))
    );

    // Unreachable server: could not ask, and says so apart from a verdict.
    server.stop().await;
    let (code, _, err) = tokio::task::spawn_blocking(move || {
        heddle_as(
            &url,
            &admin,
            &["preflight", "--nodes", "good", "--wait", "0"],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot reach"), "{err}");
}
