//! Expectations set by operators and by site plugins: checked, judging a node's results
//! while they stand, audited.

use super::*;

#[tokio::test]
async fn expectations_from_operators_and_plugins() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let viewer = server.token(heddle_types::auth::Role::Viewer).await;
    let a = enroll(&api, &server, "m1").await;
    nothing_to_compare_with_is_unknown(&api, &server, &a).await;
    let id = an_operator_expectation_is_checked(&api, &admin, &viewer).await;
    it_judges_until_deleted_and_is_audited(&api, &server, &a, [&admin, &viewer], &id).await;
    a_site_plugins_expectation_judges_until_disabled(&api, &server, &a, &viewer).await;
}

/// Nothing to compare with yet.
async fn nothing_to_compare_with_is_unknown(api: &Api, server: &TestServer, a: &FakeAgent) {
    let r = run_once(
        api,
        server,
        a,
        "m1",
        "memcpy",
        json!({}),
        memcpy_upload("m-0", 9.0),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "unknown", "{r}");
}

/// Only an admin sets one, and only a well-formed one for a node that exists. Returns its
/// id.
async fn an_operator_expectation_is_checked(api: &Api, admin: &str, viewer: &str) -> String {
    let body = json!({"test": "memcpy", "metric": "algbw_gbs", "value": 10.0, "source": "acceptance test 2026-11", "node": "m1"});
    assert_eq!(
        api.post("/api/v1/expectations", viewer, body.clone())
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    for bad in [
        json!({"test": "memcpy", "metric": "speed", "value": 1.0, "source": "x"}),
        json!({"test": "memcpy", "metric": "algbw_gbs", "value": -1.0, "source": "x"}),
        json!({"test": "memcpy", "metric": "algbw_gbs", "value": 1.0, "source": " "}),
        json!({"test": "a b", "metric": "algbw_gbs", "value": 1.0, "source": "x"}),
    ] {
        assert_eq!(
            api.post("/api/v1/expectations", admin, bad.clone()).await.0,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}"
        );
    }
    let (s, e) = api.post("/api/v1/expectations", admin, json!({"test": "memcpy", "metric": "algbw_gbs", "value": 1.0, "source": "x", "node": "nope"})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{e}");
    let (s, created) = api.post("/api/v1/expectations", admin, body).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert_eq!(
        (created["origin"].as_str(), created["node"].as_str()),
        (Some("operator"), Some("m1"))
    );
    created["id"].as_str().unwrap().to_string()
}

/// The operator's expectation judges the node's results until it is deleted; both are
/// audited.
async fn it_judges_until_deleted_and_is_audited(
    api: &Api,
    server: &TestServer,
    a: &FakeAgent,
    [admin, viewer]: [&str; 2],
    id: &str,
) {
    let r = run_once(
        api,
        server,
        a,
        "m1",
        "memcpy",
        json!({}),
        memcpy_upload("m-1", 8.0),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    assert_eq!(bases(&r)[0], "expectation:acceptance test 2026-11");
    let r = run_once(
        api,
        server,
        a,
        "m1",
        "memcpy",
        json!({}),
        memcpy_upload("m-2", 12.0),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "pass", "{r}");

    let (_, list) = api.get("/api/v1/expectations?test=memcpy", viewer).await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    let (_, builtin) = api.get("/api/v1/expectations?origin=builtin", viewer).await;
    assert!(
        builtin
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["test"] == "nccl.all_reduce" && e["value"] == 260.0),
        "{builtin}"
    );
    assert_eq!(
        api.call(
            Method::DELETE,
            &format!("/api/v1/expectations/{id}"),
            Some(viewer),
            None
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        api.call(
            Method::DELETE,
            &format!("/api/v1/expectations/{id}"),
            Some(admin),
            None
        )
        .await
        .0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        api.call(
            Method::DELETE,
            &format!("/api/v1/expectations/{id}"),
            Some(admin),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    let (_, audit) = api.get("/api/v1/audit", admin).await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(
        actions.contains(&"expectation.create") && actions.contains(&"expectation.delete"),
        "{actions:?}"
    );
}

/// A site plugin's expectations judge the node's results while it is enabled.
async fn a_site_plugins_expectation_judges_until_disabled(
    api: &Api,
    server: &TestServer,
    a: &FakeAgent,
    viewer: &str,
) {
    // A site plugin's output row: {"expectations": [...]} on the node's plugin result.
    let db = &server.state.db;
    let mut tx = db.begin().await.unwrap();
    let (plugin, version) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let sha = "ab".repeat(32);
    sqlx::query("INSERT INTO plugin_blobs (sha256, bytes, size_bytes) VALUES ($1, '\\x00', 1)")
        .bind(&sha)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO plugins (id, name, enabled) VALUES ($1, 'site-sku', true)")
        .bind(plugin)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("INSERT INTO plugin_versions (id, plugin_id, version, sha256, uploaded_by) VALUES ($1, $2, '1.0.0', $3, 'test')")
        .bind(version).bind(plugin).bind(&sha).execute(&mut *tx).await.unwrap();
    sqlx::query("UPDATE plugins SET active_version_id = $1 WHERE id = $2")
        .bind(version)
        .bind(plugin)
        .execute(&mut *tx)
        .await
        .unwrap();
    let output = json!({"traits": {}, "env": [], "expectations": [
        {"test": "memcpy", "metric": "algbw_gbs", "min_size_bytes": 1048576, "value": 20.0, "source": "SKU table row 7"},
        {"test": "memcpy", "metric": "algbw_gbs", "value": "not a number", "source": "ignored"}
    ]});
    sqlx::query(
        "INSERT INTO plugin_results (node_id, plugin_id, version_id, facts_sha256, output)
         SELECT id, $2, $3, coalesce(facts_sha256, ''), $4 FROM nodes WHERE hostname = $1",
    )
    .bind("m1")
    .bind(plugin)
    .bind(version)
    .bind(&output)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let r = run_once(
        api,
        server,
        a,
        "m1",
        "memcpy",
        json!({}),
        memcpy_upload("m-3", 15.0),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    assert_eq!(bases(&r)[0], "expectation:plugin site-sku: SKU table row 7");
    let (_, listed) = api
        .get("/api/v1/expectations?node=m1&origin=plugin", viewer)
        .await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // A disabled plugin's expectations no longer count.
    sqlx::query("UPDATE plugins SET enabled = false WHERE id = $1")
        .bind(plugin)
        .execute(db)
        .await
        .unwrap();
    let r = run_once(
        api,
        server,
        a,
        "m1",
        "memcpy",
        json!({}),
        memcpy_upload("m-4", 15.0),
    )
    .await;
    assert_ne!(r["verdict"]["verdict"], "fail", "{r}");
}
