//! A plugin cannot stall the server, and a failure of the host is not a plugin's verdict.

mod common;

use std::time::{Duration, Instant};

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn upload(api: &Api, token: &str, name: &str, version: &str, bytes: Vec<u8>) {
    let (s, v) = api
        .raw(
            Method::POST,
            &format!("/api/v1/plugins/{name}/versions/{version}"),
            Some(token),
            "application/wasm",
            bytes,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

/// The outcome row of `plugin` on `node`, once there is one (30 s at most).
async fn outcome(api: &Api, admin: &str, node: &str, plugin: &str) -> Value {
    let started = Instant::now();
    loop {
        let (_, all) = api
            .get(&format!("/api/v1/nodes/{node}/plugins"), admin)
            .await;
        if let Some(o) = all
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["plugin"] == plugin)
        {
            return o.clone();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no outcome of {plugin} on {node}: {all}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_plugin_dry_run_answers_and_the_server_shuts_down() {
    // `std::thread::sleep(1 h)` in a plugin: a WASI clock wait, host code where fuel and the
    // epoch deadline do not reach.
    let server = TestServer::start_with(|c| c.plugin_timeout_ms = 500).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let node = enroll(&api, &server, "sleepy").await;
    node.put_facts(
        &api,
        json!({"host": {"hostname": "sleepy"}, "hostile": "sleep"}),
    )
    .await;
    upload(&api, &admin, "misbehave", "1.0.0", dist("misbehave")).await;

    let dry_run = || {
        let api = Api::new(&server);
        let admin = admin.clone();
        async move {
            api.post(
                "/api/v1/plugins/misbehave/versions/1.0.0/dry-run",
                &admin,
                json!({}),
            )
            .await
        }
    };
    let (s, report) = tokio::time::timeout(Duration::from_secs(20), dry_run())
        .await
        .expect("the dry run of a sleeping plugin must answer");
    assert_eq!(s, StatusCode::OK, "{report}");
    assert_eq!(report["failed"], 1, "{report}");
    let error = report["nodes"][0]["error"].as_str().unwrap();
    assert!(error.ends_with("[timeout]"), "{error}");

    // Enabled, it gets an outcome on the node like any failing plugin.
    api.post("/api/v1/plugins/misbehave/enable", &admin, json!({}))
        .await;
    let o = outcome(&api, &admin, "sleepy", "misbehave").await;
    assert!(o.to_string().contains("[timeout]"), "{o}");

    // A graceful stop with a dry run of it in flight completes (the test server gives up
    // waiting after 10 s).
    let in_flight = tokio::spawn(dry_run());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    in_flight.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_side_failure_keeps_the_nodes_recommendations() {
    let mut first = TestServer::start().await;
    let api = Api::new(&first);
    let admin = first.admin_token.clone();
    let node = enroll(&api, &first, "roce-node").await;
    let facts = fixture_facts("runai-roce");
    node.put_facts(&api, facts.clone()).await;
    upload(&api, &admin, "runai-roce", "0.1.0", dist("runai-roce")).await;
    api.post("/api/v1/plugins/runai-roce/enable", &admin, json!({}))
        .await;
    let before = outcome(&api, &admin, "roce-node", "runai-roce").await;
    assert!(before["error"].is_null(), "{before}");
    let (_, env) = api.get("/api/v1/nodes/roce-node/env", &admin).await;
    let env = env.as_str().unwrap().to_string();
    assert!(env.contains("export NCCL_IB_GID_INDEX="), "{env}");

    // A replica whose host cannot compile the plugin in time (a host-side failure, as a full
    // instance pool would be) sees the node's facts change.
    let db = first.db.take();
    let url = first.database_url();
    first.stop().await;
    let second = TestServer::start_on(&url, |c| c.plugin_compile_timeout_ms = 1).await;
    let api = Api::new(&second);
    let mut changed = facts;
    changed["host"]["kernel"] = json!("6.8.0-changed");
    node.put_facts(&api, changed).await;
    let evaluated = reconcile(&second.state).await.unwrap();
    assert_eq!(evaluated, 0, "the node must be left for a later try");

    // Nothing was recorded as the plugin's verdict and nothing was taken from the node.
    let after = outcome(&api, &admin, "roce-node", "runai-roce").await;
    assert!(after["error"].is_null(), "{after}");
    let (_, env_after) = api.get("/api/v1/nodes/roce-node/env", &admin).await;
    assert_eq!(env_after.as_str().unwrap(), env);
    let (_, n) = api.get("/api/v1/nodes/roce-node", &admin).await;
    assert_eq!(n["traits"]["orchestrator"], "runai", "{n}");
    second.stop().await;
    drop(db);
}
