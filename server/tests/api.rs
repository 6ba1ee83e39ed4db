//! The REST API against a real server and a real Postgres database per test.

#[path = "api/auth.rs"]
mod auth;
mod common;
#[path = "api/input.rs"]
mod input;
#[path = "api/plugin_versions.rs"]
mod plugin_versions;

use common::*;
use heddle_server::testing::TestServer;
use heddle_types::auth::Role;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn health_metrics_and_openapi() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    assert_eq!(
        api.call(Method::GET, "/healthz", None, None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        api.call(Method::GET, "/readyz", None, None).await.0,
        StatusCode::OK
    );
    let (status, metrics) = api.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics.as_str().unwrap();
    assert!(metrics.contains("heddle_agents_online"), "{metrics}");
    assert!(
        metrics.contains("heddle_jobs{state=\"queued\"} 0"),
        "{metrics}"
    );
    assert!(metrics.contains("heddle_http_requests_total"), "{metrics}");
    let (status, doc) = api
        .call(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut routes: Vec<String> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            routes.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    routes.sort();
    insta::assert_snapshot!(routes.join("\n"));
    // The server's own probes have their own tag; "health" is a node's or the fleet's verdict.
    for probe in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            doc["paths"][probe]["get"]["tags"],
            json!(["probes"]),
            "{probe}"
        );
    }
    // What OpenAPI validators refuse: an operation id used twice, a reference to a schema
    // the document does not define.
    let mut ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    ids.sort_unstable();
    let twice: Vec<_> = ids.windows(2).filter(|w| w[0] == w[1]).collect();
    assert!(twice.is_empty(), "operation ids used twice: {twice:?}");
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut refs = Vec::new();
    schema_refs(&doc, &mut refs);
    assert!(
        refs.contains(&"#/components/schemas/SeriesChart"),
        "{refs:?}"
    );
    for r in refs {
        let name = r.strip_prefix("#/components/schemas/");
        assert!(
            name.is_some_and(|n| schemas.contains_key(n)),
            "{r} names no schema of the document"
        );
    }
    // The homepage says where a person is.
    let (status, page) = api.call(Method::GET, "/", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.as_str().unwrap().contains("Heddle"));
}

/// Every `$ref` in a JSON document.
fn schema_refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                out.push(r);
            }
            m.values().for_each(|x| schema_refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| schema_refs(x, out)),
        _ => {}
    }
}

#[tokio::test]
async fn enroll_heartbeat_facts_filters_and_history() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let a = enroll(&api, &server, "nd40-1").await;
    let b = enroll(&api, &server, "roce-1").await;
    let facts_a = heartbeats_ask_for_facts_that_changed(&api, &a, &b).await;
    nodes_are_filtered_by_facts_and_traits(&api, &admin, &a).await;
    history_keeps_one_entry_per_change(&api, &admin, &a, &facts_a).await;
}

/// A heartbeat asks for facts the server has not got; facts that are not an object are
/// refused. Returns nd40-1's facts.
async fn heartbeats_ask_for_facts_that_changed(api: &Api, a: &FakeAgent, b: &FakeAgent) -> Value {
    let (s, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"agent_version": "1.0", "facts_sha256": null}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{hb}");
    assert_eq!(hb["send_facts"], true, "the server has no facts yet");

    let facts_a = json!({
        "schema_version": 1, "collected_at": "2026-01-01T00:00:00Z",
        "host": {"hostname": "nd40-1"},
        "gpus": [{"name": "Tesla V100-SXM2-32GB"}, {"name": "Tesla V100-SXM2-32GB"}],
        "rdma": {"devices": [
            {"name": "mlx5_0", "ports": [{"state": "ACTIVE", "link_layer": "InfiniBand"}]},
            {"name": "rdmaP36305p0s2", "ports": [{"state": "ACTIVE", "link_layer": "Ethernet"}]}]}
    });
    let (s, acc) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&a.credential),
            Some(facts_a.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{acc}");
    assert_eq!(acc["changed"], true);
    let sha = acc["facts_sha256"].as_str().unwrap().to_string();
    // Same facts, a later collection time: no change, no new history entry.
    let mut again = facts_a.clone();
    again["collected_at"] = json!("2026-01-02T00:00:00Z");
    let (_, acc) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&a.credential),
            Some(again),
        )
        .await;
    assert_eq!(acc["changed"], false);
    let (_, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"facts_sha256": sha}),
        )
        .await;
    assert_eq!(hb["send_facts"], false);
    let (_, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"facts_sha256": "0".repeat(64)}),
        )
        .await;
    assert_eq!(hb["send_facts"], true);

    let facts_b = json!({
        "host": {"hostname": "roce-1"}, "gpus": [{"name": "NVIDIA H200"}],
        "rdma": {"devices": [{"name": "mlx5_bond_0", "ports": [{"state": "DOWN", "link_layer": "Ethernet"}]}]}
    });
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&b.credential),
            Some(facts_b),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&b.credential),
            Some(json!([1, 2])),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    facts_a
}

/// The hostnames of a list of nodes.
fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostname"].as_str().unwrap().to_string())
        .collect()
}

async fn nodes_are_filtered_by_facts_and_traits(api: &Api, admin: &str, a: &FakeAgent) {
    let (_, all) = api.get("/api/v1/nodes", admin).await;
    assert_eq!(names(&all), ["nd40-1", "roce-1"]);
    // Liveness under its name and, deprecated, its first one.
    assert_eq!(
        (&all[0]["liveness"], &all[0]["health"]),
        (&json!("online"), &json!("online"))
    );
    assert_eq!(all[0]["gpu_count"], 2);
    assert_eq!(all[0]["gpu_model"], "Tesla V100-SXM2-32GB");
    for (query, expect) in [
        ("gpu_model=NVIDIA%20H200", vec!["roce-1"]),
        ("min_gpus=2", vec!["nd40-1"]),
        ("hca=mlx5_0", vec!["nd40-1"]),
        ("port_state=DOWN", vec!["roce-1"]),
        ("link_layer=Ethernet", vec!["nd40-1", "roce-1"]),
        ("link_layer=InfiniBand", vec!["nd40-1"]),
        ("hostname=ROCE", vec!["roce-1"]),
        ("health=online", vec!["nd40-1", "roce-1"]),
        ("health=offline", vec![]),
    ] {
        let (s, got) = api.get(&format!("/api/v1/nodes?{query}"), admin).await;
        assert_eq!(s, StatusCode::OK, "{query}: {got}");
        assert_eq!(names(&got), expect, "{query}");
    }
    // Traits set by a plugin's recommendations are filterable too.
    let (s, _) = api
        .call(Method::PUT, "/api/v1/nodes/nd40-1/recommendations", Some(admin),
            Some(json!({"source": "survey:azure", "traits": {"cloud": "azure"},
                "items": [{"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": "the InfiniBand HCA; rdmaP… is accelerated networking"}]})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, got) = api.get("/api/v1/nodes?trait=cloud=azure", admin).await;
    assert_eq!(names(&got), ["nd40-1"]);

    let (s, node) = api.get("/api/v1/nodes/nd40-1", admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(node["facts"]["host"]["hostname"], "nd40-1");
    assert_eq!(node["recommendations"][0]["name"], "NCCL_IB_HCA");
    let (_, by_id) = api
        .get(&format!("/api/v1/nodes/{}", a.node_id), admin)
        .await;
    assert_eq!(by_id["hostname"], "nd40-1");
}

/// History keeps one entry per change; the agents list shows both online.
async fn history_keeps_one_entry_per_change(
    api: &Api,
    admin: &str,
    a: &FakeAgent,
    facts_a: &Value,
) {
    let mut changed = facts_a.clone();
    changed["rdma"]["devices"][0]["ports"][0]["state"] = json!("DOWN");
    api.call(
        Method::PUT,
        "/api/v1/agent/facts",
        Some(&a.credential),
        Some(changed),
    )
    .await;
    let (_, hist) = api.get("/api/v1/nodes/nd40-1/facts/history", admin).await;
    let hist = hist.as_array().unwrap();
    assert_eq!(hist.len(), 2);
    assert_eq!(
        hist[0]["facts"]["rdma"]["devices"][0]["ports"][0]["state"],
        "DOWN"
    );
    let (_, got) = api.get("/api/v1/nodes?port_state=DOWN", admin).await;
    assert_eq!(names(&got), ["nd40-1", "roce-1"]);

    // Agents list shows both online.
    let (_, agents) = api.get("/api/v1/agents", admin).await;
    assert_eq!(agents.as_array().unwrap().len(), 2);
    assert!(
        agents
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["state"] == "online" && a["health"] == "online")
    );
}

#[tokio::test]
async fn env_export_merges_plugins_and_tuning_profiles() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    enroll(&api, &server, "env-1").await;
    api.call(
        Method::PUT,
        "/api/v1/nodes/env-1/recommendations",
        Some(&admin),
        Some(json!({
        "source": "survey:roce",
        "items": [
            {"name": "NCCL_IB_GID_INDEX", "value": "3", "reason": "RoCE v2 IPv4-mapped GID"},
            {"name": "NCCL_SOCKET_NTHREADS", "value": "2", "reason": "default"},
            {"name": "NCCL_IB_HCA", "value": "mlx5_bond_0", "reason": "the ACTIVE RoCE HCA"}
        ]})),
    )
    .await;
    assert_eq!(
        api.post("/api/v1/sites", &admin, json!({"name": "dc1"}))
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        api.call(
            Method::PATCH,
            "/api/v1/nodes/env-1",
            Some(&admin),
            Some(json!({"site": "dc1"}))
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    let (s, b) = api.post("/api/v1/tuning-profiles", &admin, json!({"name": "dc1-sockets", "site": "dc1", "env": {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "8"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _) = api.post("/api/v1/tuning-profiles", &admin, json!({"name": "env1-weird", "node": "env-1", "env": {"NCCL_NSOCKS_PERTHREAD": "4", "UCX_TLS": "a b'c"}})).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = api
        .post(
            "/api/v1/tuning-profiles",
            &admin,
            json!({"name": "both", "node": "env-1", "site": "dc1", "env": {"NCCL_ALGO": "Ring"}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, text) = api.get("/api/v1/nodes/env-1/env", &admin).await;
    assert_eq!(s, StatusCode::OK);
    let text = text.as_str().unwrap();
    let exports: Vec<&str> = text.lines().filter(|l| l.starts_with("export ")).collect();
    assert_eq!(
        exports,
        [
            "export NCCL_IB_GID_INDEX=3",
            "export NCCL_IB_HCA=mlx5_bond_0",
            "export NCCL_NSOCKS_PERTHREAD=4",
            "export NCCL_SOCKET_NTHREADS=4",
            r#"export UCX_TLS="a b'c""#,
        ]
    );
    // Deleting a profile takes its values out of the export.
    let (_, profiles) = api.get("/api/v1/tuning-profiles", &admin).await;
    let weird = profiles
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "env1-weird")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        api.call(
            Method::DELETE,
            &format!("/api/v1/tuning-profiles/{weird}"),
            Some(&admin),
            None
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.call(
            Method::DELETE,
            &format!("/api/v1/tuning-profiles/{weird}"),
            Some(&admin),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (_, after) = api.get("/api/v1/nodes/env-1/env", &admin).await;
    assert!(
        after
            .as_str()
            .unwrap()
            .contains("export NCCL_NSOCKS_PERTHREAD=8"),
        "the site value shows again: {after}"
    );
    assert!(!after.as_str().unwrap().contains("UCX_TLS"));

    // A shell reads it back unchanged.
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{text}\nprintf '%s|%s' \"$UCX_TLS\" \"$NCCL_IB_HCA\""
        ))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a b'c|mlx5_bond_0");
}

#[tokio::test]
async fn rendezvous_between_ranks() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let r0 = enroll(&api, &server, "rdv-0").await;
    let r1 = enroll(&api, &server, "rdv-1").await;
    let outsider = enroll(&api, &server, "rdv-x").await;
    let run = server
        .start_run(json!({"kind": "nccl", "nodes": ["rdv-0", "rdv-1"]}))
        .await;
    let path = format!("/api/v1/agent/rendezvous/{}/nccl-id", run.id);

    let (s, b) = api
        .get(&format!("{path}?timeout_ms=200"), &r1.credential)
        .await;
    assert_eq!(s, StatusCode::REQUEST_TIMEOUT, "{b}");
    assert_eq!(error_code(&b), "rendezvous_timeout");
    assert_eq!(
        api.get(&format!("{path}?timeout_ms=10"), &outsider.credential)
            .await
            .0,
        StatusCode::FORBIDDEN
    );

    let waiter = {
        let api = api.on(&api.base);
        let path = path.clone();
        let cred = r1.credential.clone();
        tokio::spawn(async move { api.get(&format!("{path}?timeout_ms=10000"), &cred).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Rank 0 publishes while it holds its job's claim.
    r0.claim(&api).await;
    let blob = json!({"blob_b64": "AAECAwQ="});
    let (s, _) = api
        .call(Method::PUT, &path, Some(&r0.credential), Some(blob.clone()))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, got) = waiter.await.unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got["blob_b64"], "AAECAwQ=");
    // Re-posting the same blob is fine; another one is a conflict; garbage is refused.
    assert_eq!(
        api.call(Method::PUT, &path, Some(&r0.credential), Some(blob))
            .await
            .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.call(
            Method::PUT,
            &path,
            Some(&r0.credential),
            Some(json!({"blob_b64": "BBBB"}))
        )
        .await
        .0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        api.call(
            Method::PUT,
            &path,
            Some(&r0.credential),
            Some(json!({"blob_b64": "%%%"}))
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
}
#[tokio::test]
async fn first_start_creates_one_admin_token_and_prints_it() {
    let db = heddle_server::testing::TestDb::create().await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    // Two replicas starting together on an empty database: exactly one creates the token.
    let (a, b) = tokio::join!(
        heddle_server::http::auth::bootstrap_admin(&pool, None),
        heddle_server::http::auth::bootstrap_admin(&pool, None)
    );
    let printed: Vec<String> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
    assert_eq!(printed.len(), 1, "one replica prints the token");
    assert!(printed[0].starts_with("hdl_"));
    assert_eq!(
        heddle_server::http::auth::bootstrap_admin(&pool, None)
            .await
            .unwrap(),
        None,
        "later starts create nothing"
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM api_tokens WHERE role = 'admin'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    // The printed token works.
    let server = TestServer::start_on(&db.url, |c| c.admin_token = None).await;
    let api = Api::new(&server);
    let (s, me) = api.get("/api/v1/whoami", &printed[0]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(me["role"], "admin");
    let (s, list) = api.get("/api/v1/enrollment-tokens", &printed[0]).await;
    assert_eq!((s, list.as_array().unwrap().len()), (StatusCode::OK, 0));
    pool.close().await;
    server.stop().await;
}
