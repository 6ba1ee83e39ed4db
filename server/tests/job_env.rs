//! A node's job environment: what the agent writes to the node env file. Its version rides
//! on heartbeats (from memory on the fast path), changes with tuning profiles and
//! recommendations, and `GET /api/v1/agent/env` serves the entries it hashes.
//!
//! `HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh) cargo test -p heddle-server --test job_env`

mod common;

use common::{Api, FakeAgent, enroll};
use heddle_server::testing::TestServer;
use heddle_types::agent::NodeJobEnv;
use heddle_types::nccl_conf;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn heartbeat_once(api: &Api, agent: &FakeAgent) -> Value {
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/agent/heartbeat",
            Some(&agent.credential),
            Some(json!({"agent_version": "test"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// A heartbeat that carries a job environment version: a heartbeat never computes one, so
/// after a change it carries none until the versions worker has stored it (woken by the
/// write, well within a second here).
async fn heartbeat(api: &Api, agent: &FakeAgent) -> Value {
    let started = std::time::Instant::now();
    loop {
        let body = heartbeat_once(api, agent).await;
        if !body["job_env_sha256"].is_null() {
            return body;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "no job environment version on heartbeats for 10 s: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The node's health reasons coded `env-splits-communicator`, and its verdict.
async fn split_reasons(api: &Api, admin: &str, node: &str) -> (Vec<Value>, String) {
    let (status, body) = api
        .get(&format!("/api/v1/nodes/{node}/health"), admin)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reasons = body["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["code"] == "env-splits-communicator")
        .cloned()
        .collect();
    (reasons, body["verdict"].as_str().unwrap().to_string())
}

async fn agent_env(api: &Api, agent: &FakeAgent) -> NodeJobEnv {
    let (status, body) = api.get("/api/v1/agent/env", &agent.credential).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

#[tokio::test]
async fn the_heartbeat_names_the_job_env_version_and_follows_its_changes() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let agent = enroll(&api, &server, "env-node-1").await;
    let other = enroll(&api, &server, "env-node-2").await;

    let empty = nccl_conf::job_env_sha256(&[]).unwrap();
    assert_eq!(heartbeat(&api, &agent).await["job_env_sha256"], empty);
    let env = agent_env(&api, &agent).await;
    assert_eq!((env.node.as_str(), env.entries.len()), ("env-node-1", 0));
    let profile =
        a_node_profile_changes_its_version_alone(&api, &admin, [&agent, &other], &empty).await;
    deleting_it_goes_back_to_the_empty_env(&api, &admin, &agent, &profile, &empty).await;
    a_site_profile_reaches_every_node(&api, &admin, [&agent, &other], &empty).await;
    a_must_agree_variable_is_written_while_the_site_agrees(&api, &admin, [&agent, &other]).await;
}

/// A node profile changes this node's version, not the other's. Returns the profile.
async fn a_node_profile_changes_its_version_alone(
    api: &Api,
    admin: &str,
    [agent, other]: [&FakeAgent; 2],
    empty: &str,
) -> Value {
    let (status, profile) = api
        .post(
            "/api/v1/tuning-profiles",
            admin,
            json!({"name": "p1", "node": "env-node-1", "env": {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "ib0", "NCCL_ALGO": "Ring"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{profile}");
    let env = agent_env(api, agent).await;
    let names: Vec<&str> = env.entries.iter().map(|e| e.name.as_str()).collect();
    // NCCL_ALGO must be equal on every rank of a communicator: a node without a site cannot
    // show that the nodes its jobs span agree, so its file leaves it out.
    assert_eq!(names, ["NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"]);
    // ... and says so, with the warning's code.
    assert_eq!(env.left_out.len(), 1, "{:?}", env.left_out);
    assert_eq!(env.left_out[0].name, "NCCL_ALGO");
    assert_eq!(env.left_out[0].code, "env-splits-communicator");
    assert!(
        env.left_out[0].message.contains("no site"),
        "{:?}",
        env.left_out
    );
    // The node's health warns of it, the other node's does not.
    let (reasons, verdict) = split_reasons(api, admin, "env-node-1").await;
    assert_eq!(
        (reasons.len(), verdict.as_str()),
        (1, "warn"),
        "{reasons:?}"
    );
    assert!(
        reasons[0]["message"]
            .as_str()
            .unwrap()
            .contains("NCCL_ALGO=Ring is left out"),
        "{reasons:?}"
    );
    assert!(split_reasons(api, admin, "env-node-2").await.0.is_empty());
    assert_eq!(
        env.job_env_sha256,
        nccl_conf::job_env_sha256(&env.entries).unwrap()
    );
    assert_eq!(
        heartbeat(api, agent).await["job_env_sha256"],
        env.job_env_sha256
    );
    assert_eq!(heartbeat(api, other).await["job_env_sha256"], empty);
    // The public endpoint the CLI renders from says the same.
    let (status, public) = api.get("/api/v1/nodes/env-node-1/job-env", admin).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(public, serde_json::to_value(&env).unwrap());
    profile
}

/// Deleting it goes back to the empty environment, answered on the next heartbeat.
async fn deleting_it_goes_back_to_the_empty_env(
    api: &Api,
    admin: &str,
    agent: &FakeAgent,
    profile: &Value,
    empty: &str,
) {
    let id = profile["id"].as_str().unwrap();
    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/tuning-profiles/{id}"),
            Some(admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(heartbeat(api, agent).await["job_env_sha256"], empty);
}

/// A site profile reaches every node of the site.
async fn a_site_profile_reaches_every_node(
    api: &Api,
    admin: &str,
    [agent, other]: [&FakeAgent; 2],
    empty: &str,
) {
    let (status, _) = api
        .post("/api/v1/sites", admin, json!({"name": "hall-a"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for node in ["env-node-1", "env-node-2"] {
        let (status, body) = api
            .call(
                Method::PATCH,
                &format!("/api/v1/nodes/{node}"),
                Some(admin),
                Some(json!({"site": "hall-a"})),
            )
            .await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    }
    let (status, _) = api
        .post(
            "/api/v1/tuning-profiles",
            admin,
            json!({"name": "site-a", "site": "hall-a", "env": {"NCCL_SOCKET_IFNAME": "eth0"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let a = heartbeat(api, agent).await["job_env_sha256"].clone();
    let b = heartbeat(api, other).await["job_env_sha256"].clone();
    assert_eq!(a, b);
    assert_ne!(a, empty);
    assert_eq!(
        agent_env(api, other).await.entries[0].name,
        "NCCL_SOCKET_IFNAME"
    );
}

/// A must-agree variable is written while every node of the site has the same value, and
/// left out of every node's file once one node's value differs.
async fn a_must_agree_variable_is_written_while_the_site_agrees(
    api: &Api,
    admin: &str,
    [agent, other]: [&FakeAgent; 2],
) {
    // A must-agree variable is written while every node of the site has the same value...
    let (status, _) = api
        .post(
            "/api/v1/tuning-profiles",
            admin,
            json!({"name": "site-algo", "site": "hall-a", "env": {"NCCL_ALGO": "Ring"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for a in [&agent, &other] {
        let env = agent_env(api, a).await;
        assert!(
            env.entries
                .iter()
                .any(|e| e.name == "NCCL_ALGO" && e.value == "Ring"),
            "{:?}",
            env.entries
        );
    }
    for node in ["env-node-1", "env-node-2"] {
        let (reasons, _) = split_reasons(api, admin, node).await;
        assert!(reasons.is_empty(), "{node}: {reasons:?}");
    }
    // ... and left out of every node's file once one node's value differs, the other
    // node's version following on its next heartbeat.
    let (status, body) = api
        .post(
            "/api/v1/tuning-profiles",
            admin,
            json!({"name": "n1-algo", "node": "env-node-1", "env": {"NCCL_ALGO": "Tree"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for a in [&agent, &other] {
        let env = agent_env(api, a).await;
        assert!(
            env.entries.iter().all(|e| e.name != "NCCL_ALGO"),
            "{:?}",
            env.entries
        );
        let left: Vec<&str> = env.left_out.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(left, ["NCCL_ALGO"], "{:?}", env.left_out);
        assert_eq!(
            env.left_out[0].differing_nodes.len(),
            1,
            "{:?}",
            env.left_out
        );
        assert_eq!(
            heartbeat(api, a).await["job_env_sha256"],
            env.job_env_sha256
        );
    }
    // Each node's health names the other as the one that differs.
    for (node, peer) in [("env-node-1", "env-node-2"), ("env-node-2", "env-node-1")] {
        let (reasons, verdict) = split_reasons(api, admin, node).await;
        assert_eq!(
            (reasons.len(), verdict.as_str()),
            (1, "warn"),
            "{reasons:?}"
        );
        assert_eq!(reasons[0]["severity"], "warn");
        assert_eq!(reasons[0]["evidence"], format!("differs on: {peer}"));
    }
}

#[tokio::test]
async fn a_stored_row_a_conf_file_cannot_carry_is_left_out() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = enroll(&api, &server, "env-node-3").await;
    // Written around the API, as a row predating the policy would be.
    sqlx::query(
        "INSERT INTO recommendations (node_id, source, name, value, reason)
         VALUES ($1::uuid, 'old', 'LD_PRELOAD', '/tmp/x.so', ''),
                ($1::uuid, 'old', 'NCCL_NET_PLUGIN', '/tmp/y.so', ''),
                ($1::uuid, 'old', 'NCCL_IB_HCA', 'mlx5_0', '')",
    )
    .bind(&agent.node_id)
    .execute(&server.state.db)
    .await
    .unwrap();
    sqlx::query("UPDATE nodes SET job_env_sha256 = NULL WHERE id = $1::uuid")
        .bind(&agent.node_id)
        .execute(&server.state.db)
        .await
        .unwrap();
    let env = agent_env(&api, &agent).await;
    let names: Vec<&str> = env.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["NCCL_IB_HCA"]);
    assert_eq!(
        heartbeat(&api, &agent).await["job_env_sha256"],
        env.job_env_sha256
    );
}

#[tokio::test]
async fn unknown_versions_are_computed_in_batches_not_by_heartbeats() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let mut agents = Vec::new();
    for i in 0..3 {
        agents.push(enroll(&api, &server, &format!("env-batch-{i}")).await);
    }
    let ids: Vec<String> = agents.iter().map(|a| a.node_id.clone()).collect();
    // Every version is known once the worker has run; then made unknown around the API.
    for a in &agents {
        heartbeat(&api, a).await;
    }
    let db = &server.state.db;
    let null_them = || async {
        sqlx::query("UPDATE nodes SET job_env_sha256 = NULL WHERE id = ANY($1::uuid[])")
            .bind(&ids)
            .execute(db)
            .await
            .unwrap();
    };
    null_them().await;
    let stored = || async {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM nodes WHERE id = ANY($1::uuid[]) AND job_env_sha256 IS NOT NULL",
        )
        .bind(&ids)
        .fetch_one(db)
        .await
        .unwrap();
        n
    };
    // Batches of two: three nodes take two batches, then there is nothing to do. The
    // worker shares the rows by SKIP LOCKED, so together they store each once.
    let first = heddle_server::job_env::refresh_due(db, 2)
        .await
        .unwrap()
        .len();
    assert!(first <= 2, "a batch of two stored {first}");
    let mut done = first;
    let started = std::time::Instant::now();
    while stored().await < 3 {
        done += heddle_server::job_env::refresh_due(db, 2)
            .await
            .unwrap()
            .len();
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
    assert!(done <= 3, "{done}");
    assert!(
        heddle_server::job_env::refresh_due(db, 2)
            .await
            .unwrap()
            .is_empty()
    );
    // What the batch stored is what the node's own computation gives.
    for a in &agents {
        let env = agent_env(&api, a).await;
        assert_eq!(
            env.job_env_sha256,
            nccl_conf::job_env_sha256(&env.entries).unwrap()
        );
        let (sha,): (Option<String>,) =
            sqlx::query_as("SELECT job_env_sha256 FROM nodes WHERE id = $1::uuid")
                .bind(&a.node_id)
                .fetch_one(db)
                .await
                .unwrap();
        assert_eq!(sha.as_deref(), Some(env.job_env_sha256.as_str()));
    }
}
