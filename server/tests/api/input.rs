//! Requests that are malformed, oversized, duplicated or carry bytes Postgres cannot
//! store: each gets a clear error, and none writes anything.

use super::*;

#[tokio::test]
async fn bad_input_gets_clear_errors_and_writes_nothing() {
    let server = TestServer::start_with(|c| c.max_body_bytes = 64 * 1024).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    enroll(&api, &server, "bad-1").await;
    bodies_that_do_not_decode(&api, &admin).await;
    paths_and_queries_that_do_not_parse(&api, &admin).await;
    nul_bytes_postgres_cannot_store(&server, &api, &admin).await;
    duplicates_conflict(&api, &admin).await;
    the_refused_requests_wrote_nothing(&server, &api, &admin).await;
}

async fn bodies_that_do_not_decode(api: &Api, admin: &str) {
    let (s, b) = api
        .raw(
            Method::POST,
            "/api/v1/runs",
            Some(admin),
            "application/json",
            b"{not json".to_vec(),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    error_code(&b);
    let (s, b) = api
        .raw(
            Method::POST,
            "/api/v1/runs",
            Some(admin),
            "text/plain",
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "missing content type: {b}");
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": 5, "nodes": ["bad-1"]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "wrong type: {b}");
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "memcpy", "nodes": ["bad-1"], "nodez": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "unknown field: {b}");
    assert!(b["message"].as_str().unwrap().contains("nodez"), "{b}");
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "memcpy", "nodes": ["no-such-node"]}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "memcpy", "nodes": ["bad-1", "bad-1"]}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, _) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "memcpy", "nodes": []}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "memcpy", "nodes": ["bad-1"], "env": {"BAD-NAME": "1"}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let huge = "x".repeat(100 * 1024);
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "memcpy", "nodes": ["bad-1"], "label": huge}),
        )
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{b}");
    assert_eq!(error_code(&b), "payload_too_large");
}

async fn paths_and_queries_that_do_not_parse(api: &Api, admin: &str) {
    let (s, b) = api.get("/api/v1/runs/not-a-uuid", admin).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    let (s, b) = api
        .get("/api/v1/runs/00000000-0000-0000-0000-000000000000", admin)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    let (s, _) = api.get("/api/v1/nodes?min_gpus=lots", admin).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = api.get("/api/v1/nodes?trait=novalue", admin).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = api.get("/api/v1/nodes?colour=blue", admin).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

/// NUL bytes, which Postgres cannot store, in paths and bodies.
async fn nul_bytes_postgres_cannot_store(server: &TestServer, api: &Api, admin: &str) {
    for path in [
        "/api/v1/nodes/%00",
        "/api/v1/plugins/0/versions/%00/wasm",
        "/api/v1/nodes/a%00b/env",
    ] {
        let (s, b) = api.get(path, admin).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path}: {b}");
    }
    let (s, b) = api
        .post("/api/v1/plugins/%00/disable", admin, json!(null))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    let agent = enroll(api, server, "nul-1").await;
    let (s, b) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&agent.credential),
            Some(json!({"\u{0}": null, "host": {"hostname": "a\u{0}b"}})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, b) = api
        .post(
            "/api/v1/sites",
            admin,
            json!({"name": "ok", "traits": {"k": "v\u{0}"}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, b) = api.get("/api/v1/no-such-route", admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&b), "not_found");
}

async fn duplicates_conflict(api: &Api, admin: &str) {
    assert_eq!(
        api.post("/api/v1/sites", admin, json!({"name": "dup"}))
            .await
            .0,
        StatusCode::CREATED
    );
    let (s, b) = api
        .post("/api/v1/sites", admin, json!({"name": "dup"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert!(b["message"].as_str().unwrap().contains("dup"));
    assert_eq!(
        api.post(
            "/api/v1/tokens",
            admin,
            json!({"name": "dup", "role": "viewer"})
        )
        .await
        .0,
        StatusCode::CREATED
    );
    assert_eq!(
        api.post(
            "/api/v1/tokens",
            admin,
            json!({"name": "dup", "role": "admin"})
        )
        .await
        .0,
        StatusCode::CONFLICT
    );
    let (s, _) = api
        .post(
            "/api/v1/tokens",
            admin,
            json!({"name": "x", "role": "root"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = api
        .post("/api/v1/sites", admin, json!({"name": "has space"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

/// None of the refused requests wrote anything.
async fn the_refused_requests_wrote_nothing(server: &TestServer, api: &Api, admin: &str) {
    let (_, runs) = api.get("/api/v1/runs", admin).await;
    assert_eq!(runs.as_array().unwrap().len(), 0);
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobs")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let (sites,): (i64,) = sqlx::query_as("SELECT count(*) FROM sites")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(sites, 1);
    let (facts,): (i64,) = sqlx::query_as("SELECT count(*) FROM node_facts_history")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(facts, 0);
}
