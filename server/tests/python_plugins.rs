//! A Python plugin (plugins/template-python, built by scripts/build-python-plugin.sh) through
//! the server as an operator uses it: upload at the default size cap, dry run, enable, and its
//! recommendation in the node's env export (what `heddle env` prints).

mod common;

use std::time::Duration;

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_plugin_recommendation_reaches_the_env_export() {
    // Room for an unoptimised build compiling CPython on a busy machine, and a compile cache
    // shared by the test binaries so it happens once.
    let server = TestServer::start_with(|c| {
        c.plugin_compile_timeout_ms = 900_000;
        c.plugin_cache_dir = Some(
            std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("heddle-compiled-plugins"),
        );
    })
    .await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let node = enroll(&api, &server, "roce-node").await;
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&node.credential),
            Some(fixture_facts("runai-roce")),
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    let bytes = dist("template-python");
    assert!(bytes.len() > 16 << 20, "{} bytes", bytes.len());
    let (s, v) = api
        .raw(
            Method::POST,
            "/api/v1/plugins/my-python-plugin/versions/0.1.0",
            Some(&admin),
            "application/wasm",
            bytes,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let (s, report) = api
        .post(
            "/api/v1/plugins/my-python-plugin/versions/0.1.0/dry-run",
            &admin,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(
        report["nodes"][0]["diff"]["env_added"],
        json!(["NCCL_SOCKET_IFNAME=net1"]),
        "{report}"
    );

    let (s, b) = api
        .post("/api/v1/plugins/my-python-plugin/enable", &admin, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let started = std::time::Instant::now();
    loop {
        let (_, env) = api.get("/api/v1/nodes/roce-node/env", &admin).await;
        if env
            .as_str()
            .unwrap()
            .contains("export NCCL_SOCKET_IFNAME=net1")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no NCCL_SOCKET_IFNAME in the env export: {env}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, outcomes) = api.get("/api/v1/nodes/roce-node/plugins", &admin).await;
    let ours = outcomes
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["plugin"] == "my-python-plugin")
        .unwrap_or_else(|| panic!("{outcomes}"));
    assert!(ours["error"].is_null(), "{ours}");
    server.stop().await;
}
