//! The first-party plugins enabled on a fresh server, and `env/explain`: the one conflict
//! rule between plugins and tuning profiles, with what each winner overrode.
//!
//! `HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh) cargo test -p heddle-server --test recommendations`

mod common;

use std::time::Duration;

use common::{Api, enroll, eventually, fixture_facts};
use heddle_server::plugins_bundled::{self, BUNDLED_BY, Outcome};
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// How long the reconciler, which runs in the background, may take.
const PATIENCE: Duration = Duration::from_secs(30);

fn var<'a>(explained: &'a Value, name: &str) -> Option<&'a Value> {
    explained.as_array()?.iter().find(|v| v["name"] == name)
}

#[tokio::test]
async fn a_fresh_server_explains_the_first_party_recommendations() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();

    let outcomes = plugins_bundled::register(&server.state.db, &server.state.plugins)
        .await
        .unwrap();
    let names: Vec<_> = outcomes.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["dgx-affinity", "azure-nd", "runai-roce"]);
    assert!(
        outcomes
            .iter()
            .all(|(_, o)| matches!(o, Outcome::Registered { .. }))
    );
    // A second start (or a second replica) changes nothing.
    let again = plugins_bundled::register(&server.state.db, &server.state.plugins)
        .await
        .unwrap();
    assert!(again.iter().all(|(_, o)| *o == Outcome::Unchanged));
    let (_, plugins) = api.get("/api/v1/plugins", &admin).await;
    assert_eq!(plugins.as_array().unwrap().len(), 3);
    assert!(
        plugins
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["enabled"] == true)
    );

    let node = enroll(&api, &server, "dgx1-01").await;
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&node.credential),
            Some(fixture_facts("dgx1")),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let explained = eventually("recommendations for dgx1-01", PATIENCE, async || {
        let (_, v) = api.get("/api/v1/nodes/dgx1-01/env/explain", &admin).await;
        var(&v, "NCCL_IB_HCA").is_some().then_some(v)
    })
    .await;
    let hca = var(&explained, "NCCL_IB_HCA").unwrap();
    assert_eq!(hca["value"], "=mlx5_0,mlx5_1,mlx5_2,mlx5_3");
    assert_eq!(hca["source"], "plugin:dgx-affinity@0.1.0");
    assert!(hca["reason"].as_str().unwrap().contains("PCIe switch"));
    assert_eq!(
        var(&explained, "UCX_TLS").unwrap()["value"],
        "rc,cuda_copy,cuda_ipc"
    );

    // A node tuning profile wins, and the plugin's value is shown as overridden.
    let (s, v) = api
        .post(
            "/api/v1/tuning-profiles",
            &admin,
            json!({"name": "two-rails", "node": "dgx1-01", "env": {"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (_, explained) = api.get("/api/v1/nodes/dgx1-01/env/explain", &admin).await;
    let hca = var(&explained, "NCCL_IB_HCA").unwrap();
    assert_eq!(
        (&hca["value"], &hca["source"]),
        (&json!("=mlx5_0,mlx5_1"), &json!("tuning:two-rails"))
    );
    let lost = hca["overridden"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{hca}");
    assert_eq!(
        (&lost[0]["value"], &lost[0]["source"]),
        (
            &json!("=mlx5_0,mlx5_1,mlx5_2,mlx5_3"),
            &json!("plugin:dgx-affinity@0.1.0")
        )
    );
    assert!(lost[0]["reason"].as_str().unwrap().contains("PCIe switch"));
    // The node detail and the export apply the same rule.
    let (_, detail) = api.get("/api/v1/nodes/dgx1-01", &admin).await;
    let rec = detail["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "NCCL_IB_HCA")
        .unwrap();
    assert_eq!(rec["source"], "tuning:two-rails");
    let (s, _) = api.get("/api/v1/nodes/nobody/env/explain", &admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_admins_choice_survives_restarts_and_bundled_versions_follow_the_server() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    plugins_bundled::register(&server.state.db, &server.state.plugins)
        .await
        .unwrap();

    // Disabled by an admin: a later start leaves it disabled.
    let (s, _) = api
        .post("/api/v1/plugins/azure-nd/disable", &admin, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    // Replaced by an admin's own build: a later start leaves that active.
    let (s, v) = api
        .raw(
            Method::POST,
            "/api/v1/plugins/runai-roce/versions/9.9.9",
            Some(&admin),
            "application/wasm",
            common::dist("template"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _) = api
        .post(
            "/api/v1/plugins/runai-roce/enable",
            &admin,
            json!({"version": "9.9.9"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // A bundled version this server did not build: the next start moves it to this build.
    sqlx::query(
        "INSERT INTO plugin_blobs (sha256, bytes, size_bytes) VALUES (repeat('0', 64), '\\x00', 1)",
    )
    .execute(&server.state.db)
    .await
    .unwrap();
    sqlx::query(
        "WITH v AS (INSERT INTO plugin_versions (id, plugin_id, version, sha256, uploaded_by)
            SELECT gen_random_uuid(), id, '0.0.1', repeat('0', 64), $1 FROM plugins WHERE name = 'dgx-affinity'
            RETURNING id, plugin_id)
         UPDATE plugins p SET active_version_id = v.id FROM v WHERE p.id = v.plugin_id",
    )
    .bind(BUNDLED_BY)
    .execute(&server.state.db)
    .await
    .unwrap();

    let outcomes = plugins_bundled::register(&server.state.db, &server.state.plugins)
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            (
                "dgx-affinity",
                Outcome::Upgraded {
                    version: "0.1.0".into()
                }
            ),
            ("azure-nd", Outcome::Unchanged),
            ("runai-roce", Outcome::Unchanged),
        ]
    );
    let (_, plugins) = api.get("/api/v1/plugins", &admin).await;
    let state = |name: &str| {
        let p = plugins
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        (p["enabled"].clone(), p["active_version"].clone())
    };
    assert_eq!(state("azure-nd").0, json!(false));
    assert_eq!(state("runai-roce"), (json!(true), json!("9.9.9")));
    assert_eq!(state("dgx-affinity"), (json!(true), json!("0.1.0")));
}
