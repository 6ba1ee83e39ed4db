//! Plugins on the server: upload validation, evaluation on node facts, recommendations and
//! traits in the env export, dry runs with diffs, hostile plugins contained, disable and
//! rollback.

mod common;

use std::time::Duration;

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn upload(
    api: &Api,
    token: &str,
    name: &str,
    version: &str,
    bytes: Vec<u8>,
) -> (StatusCode, Value) {
    api.raw(
        Method::POST,
        &format!("/api/v1/plugins/{name}/versions/{version}"),
        Some(token),
        "application/wasm",
        bytes,
    )
    .await
}

/// How long the reconciler, which runs in the background, may take.
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_turn_facts_into_recommendations() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    uploads_are_validated(&server, &api, &admin).await;
    let roce = two_nodes_with_facts(&server, &api).await;
    let gid_line = an_enabled_plugin_recommends(&api, &admin).await;
    a_hostile_plugin_stops_where_triggered(&api, &admin).await;
    a_dry_run_changes_nothing(&api, &admin, &gid_line).await;
    disabled_rolled_back_and_evaluated_again(&api, &admin, &roce, &gid_line).await;
}

/// Upload validation: the host parses the component and checks world and imports.
async fn uploads_are_validated(server: &TestServer, api: &Api, admin: &str) {
    let http_client =
        wat::parse_str(r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#)
            .unwrap();
    let (s, b) = upload(api, admin, "net", "1", http_client).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("disallowed-import"),
        "{b}"
    );
    let (s, b) = upload(
        api,
        admin,
        "junk",
        "1",
        b"\0asm\x0d\0\x01\0garbage".to_vec(),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("not-a-component"),
        "{b}"
    );
    let (plugins,): (i64,) = sqlx::query_as("SELECT count(*) FROM plugin_versions")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(plugins, 0, "refused uploads store nothing");
}

/// roce-node with the RoCE fixture's facts, evil-node with facts that make `misbehave`
/// loop. Returns roce-node's agent.
async fn two_nodes_with_facts(server: &TestServer, api: &Api) -> FakeAgent {
    let roce = enroll(api, server, "roce-node").await;
    let evil = enroll(api, server, "evil-node").await;
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&roce.credential),
            Some(fixture_facts("runai-roce")),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&evil.credential),
            Some(json!({"host": {"hostname": "evil-node"}, "hostile": "loop"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    roce
}

/// runai-roce uploaded changes nothing; enabled, it recommends the RoCE v2 GID and the
/// HCAs. Returns the GID's line of the env export.
async fn an_enabled_plugin_recommends(api: &Api, admin: &str) -> String {
    let (s, v) = upload(api, admin, "runai-roce", "0.1.0", dist("runai-roce")).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert!(v["description"].as_str().unwrap().len() > 10, "{v}");
    // Uploaded but not enabled: nothing changes on the node.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, env) = api.get("/api/v1/nodes/roce-node/env", admin).await;
    assert!(!env.as_str().unwrap().contains("NCCL_IB_GID_INDEX"));

    assert_eq!(
        api.post("/api/v1/plugins/runai-roce/enable", admin, json!({}))
            .await
            .0,
        StatusCode::OK
    );
    let env = eventually(
        "runai-roce recommendations in the env export",
        PATIENCE,
        async || {
            let (_, env) = api.get("/api/v1/nodes/roce-node/env", admin).await;
            let env = env.as_str().unwrap().to_string();
            env.contains("export NCCL_IB_GID_INDEX=").then_some(env)
        },
    )
    .await;
    // Seed 003's rule, applied to the fixture by hand: the GID that is IPv4-mapped and RoCE v2.
    let facts = fixture_facts("runai-roce");
    let gid = facts["rdma"]["devices"][0]["ports"][0]["gids"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| {
            g["gid"]
                .as_str()
                .unwrap()
                .starts_with("0000:0000:0000:0000:0000:ffff")
                && g["gid_type"] == "RoCE v2"
        })
        .unwrap()["index"]
        .clone();
    let gid_line = format!("export NCCL_IB_GID_INDEX={gid}");
    assert!(env.contains(&gid_line), "{env}");
    assert!(env.contains("export NCCL_IB_HCA="), "{env}");
    assert!(env.contains("from plugin:runai-roce@0.1.0"), "{env}");
    let (_, outcomes) = api.get("/api/v1/nodes/roce-node/plugins", admin).await;
    assert_eq!(outcomes[0]["plugin"], "runai-roce");
    assert!(
        outcomes[0]["usage"]["fuel_consumed"].as_u64().unwrap() > 0,
        "{outcomes}"
    );
    assert!(outcomes[0]["error"].is_null());
    gid_line
}

/// A hostile plugin enabled fleet-wide: stopped on the node that triggers it, harmless
/// elsewhere, and the server keeps serving.
async fn a_hostile_plugin_stops_where_triggered(api: &Api, admin: &str) {
    assert_eq!(
        upload(api, admin, "misbehave", "1.0.0", dist("misbehave"))
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        api.post("/api/v1/plugins/misbehave/enable", admin, json!({}))
            .await
            .0,
        StatusCode::OK
    );
    let evil_out = eventually("misbehave evaluated on evil-node", PATIENCE, async || {
        let (_, o) = api.get("/api/v1/nodes/evil-node/plugins", admin).await;
        o.as_array()
            .unwrap()
            .iter()
            .find(|x| x["plugin"] == "misbehave")
            .cloned()
    })
    .await;
    assert!(
        evil_out["error"]
            .as_str()
            .unwrap()
            .contains("fuel-exhausted"),
        "{evil_out}"
    );
    assert_eq!(
        api.call(Method::GET, "/readyz", None, None).await.0,
        StatusCode::OK
    );
    let node = eventually("misbehave trait on roce-node", PATIENCE, async || {
        let (_, n) = api.get("/api/v1/nodes/roce-node", admin).await;
        (n["traits"]["misbehave.host"] == "my-first-distributed-app-worker-0").then_some(n)
    })
    .await;
    assert!(
        node["recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "NCCL_IB_GID_INDEX")
    );
}

/// Dry run of a candidate version against every node, without enabling it.
async fn a_dry_run_changes_nothing(api: &Api, admin: &str, gid_line: &str) {
    assert_eq!(
        upload(
            api,
            admin,
            "runai-roce",
            "0.2.0-candidate",
            dist("dgx-affinity")
        )
        .await
        .0,
        StatusCode::CREATED
    );
    let (s, report) = api
        .post(
            "/api/v1/plugins/runai-roce/versions/0.2.0-candidate/dry-run",
            admin,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{report}");
    let roce_row = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["hostname"] == "roce-node")
        .unwrap();
    assert_eq!(roce_row["active_version"], "0.1.0");
    assert!(
        roce_row["diff"]["env_removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().starts_with("NCCL_IB_GID_INDEX=")),
        "{roce_row}"
    );
    assert!(
        roce_row["usage"]["elapsed"].as_u64().is_some(),
        "{roce_row}"
    );
    let (s, report) = api
        .post(
            "/api/v1/plugins/misbehave/versions/1.0.0/dry-run",
            admin,
            json!({"nodes": ["evil-node"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (
            report["failed"].as_u64(),
            report["nodes"].as_array().unwrap().len()
        ),
        (Some(1), 1)
    );
    // The dry run changed nothing.
    let (_, env) = api.get("/api/v1/nodes/roce-node/env", admin).await;
    assert!(env.as_str().unwrap().contains(gid_line));
}

/// Disabled, the plugins' recommendations and traits leave the node; rolled back, they
/// come back; on new facts, they are evaluated again.
async fn disabled_rolled_back_and_evaluated_again(
    api: &Api,
    admin: &str,
    roce: &FakeAgent,
    gid_line: &str,
) {
    // Disable: its recommendations and traits leave the node.
    api.call(
        Method::POST,
        "/api/v1/plugins/misbehave/disable",
        Some(admin),
        None,
    )
    .await;
    api.call(
        Method::POST,
        "/api/v1/plugins/runai-roce/disable",
        Some(admin),
        None,
    )
    .await;
    eventually("recommendations gone after disable", PATIENCE, async || {
        let (_, n) = api.get("/api/v1/nodes/roce-node", admin).await;
        (n["recommendations"].as_array().unwrap().is_empty()
            && n["traits"].get("misbehave.host").is_none())
        .then_some(())
    })
    .await;
    // Roll back to (re-enable at) 0.1.0: they come back.
    api.post(
        "/api/v1/plugins/runai-roce/enable",
        admin,
        json!({"version": "0.1.0"}),
    )
    .await;
    eventually(
        "recommendations back after rollback",
        PATIENCE,
        async || {
            let (_, env) = api.get("/api/v1/nodes/roce-node/env", admin).await;
            env.as_str().unwrap().contains(gid_line).then_some(())
        },
    )
    .await;
    // New facts are evaluated again: a pod without RoCE loses the GID recommendation.
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&roce.credential),
            Some(json!({"host": {"hostname": "roce-node"}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    eventually("re-evaluated on new facts", PATIENCE, async || {
        let (_, env) = api.get("/api/v1/nodes/roce-node/env", admin).await;
        (!env.as_str().unwrap().contains("NCCL_IB_GID_INDEX")).then_some(())
    })
    .await;
}
