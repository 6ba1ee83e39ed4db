//! `heddle preflight` exit codes against a real server: 0 pass, 1 fail, 2 warn, 7 no
//! verdict, and 3 and up when it could not ask.

mod common;

use common::heddle_as;
use heddle_testkit::{Api, TestServer, node_with_history};
use reqwest::Method;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn preflight_exit_codes() {
    let server = TestServer::start().await;
    let (url, admin) = (server.url.clone(), server.admin_token.clone());
    // An operator expectation of 10 GB/s; `good` clears it, `bad` does not, `slow` clears it
    // but fell 20 % below its own baseline.
    let api = Api::new(&server);
    api.ok(Method::POST, "/api/v1/expectations", Some(&admin), Some(json!({"test": "memcpy", "metric": "algbw_gbs", "value": 10.0, "source": "site acceptance"}))).await;
    node_with_history(&api, "good", &[12.0]).await;
    node_with_history(&api, "bad", &[8.0]).await;
    node_with_history(&api, "slow", &[15.0, 15.0, 15.0, 12.0]).await;
    node_with_history(&api, "new", &[]).await;
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
