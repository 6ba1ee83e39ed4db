//! Fabric investigations against a real server and Postgres: what a request must be
//! (a fabric imported, suspects that read and can be tested, limits in range, an operator),
//! which nodes a round may take (enrolled, heard from, idle), and the first round's runs:
//! one nccl all_reduce each on its rail's NIC, never investigated pairwise themselves.
//! The whole investigation, from suspects to the blamed part through simulated agents, is
//! `tests/tests/fabric_investigation.rs` (heddle-loadgen --fabric).

mod common;

use common::{Api, enroll};
use heddle_server::testing::TestServer;
use heddle_types::auth::Role;
use heddle_types::fabric::generate::{FatTree, fat_tree};
use heddle_types::fabric::investigation::{FabricInvestigation, FabricTestState};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn create(api: &Api, token: &str, body: Value) -> (StatusCode, Value) {
    api.post("/api/v1/fabric/investigations", token, body).await
}

fn message(body: &Value) -> &str {
    body["message"].as_str().unwrap_or_default()
}

/// Heard from now: a node is tested only when its agent was.
async fn heartbeat(api: &Api, credential: &str) {
    let (s, body) = api
        .post(
            "/api/v1/agent/heartbeat",
            credential,
            json!({"agent_version": "test", "running_jobs": []}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn requests_are_checked_and_the_first_round_runs_on_idle_nodes() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let operator = server.token(Role::Operator).await;
    let viewer = server.token(Role::Viewer).await;

    // No fabric yet: the answer says what to do.
    let (s, body) = create(&api, &operator, json!({"suspects": ["n[0001-0004]"]})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(message(&body).contains("heddle fabric import"), "{body}");

    // 16 nodes, 2 rails, 4 nodes a leaf; n0001..n0012 enrolled, n0013..n0016 never.
    let fabric = fat_tree(&FatTree {
        nodes: 16,
        rails: 2,
        nodes_per_leaf: 4,
        spines_per_rail: 1,
    });
    let (s, body) = api
        .call(
            Method::PUT,
            "/api/v1/fabric",
            Some(&admin),
            Some(json!({"source": "heddle", "text": serde_json::to_string(&fabric).unwrap()})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let mut agents = Vec::new();
    for i in 1..=12 {
        let a = enroll(&api, &server, &format!("n{i:04}")).await;
        heartbeat(&api, &a.credential).await;
        agents.push(a);
    }

    for (body, want) in [
        (json!({"suspects": []}), "at least one node"),
        (json!({"suspects": ["n[0001-"]}), "suspects: \"n[0001-\""),
        (
            json!({"suspects": ["n0001"], "max_rounds": 0}),
            "max_rounds",
        ),
        (json!({"suspects": ["n0001"], "max_nodes": 1}), "max_nodes"),
        (json!({"suspects": ["n0001"], "timeout_s": 0}), "timeout_s"),
        (
            json!({"suspects": ["n[0013-0016]", "gpu-x"]}),
            "none of the 5 suspects can be tested",
        ),
        (
            json!({"suspects": ["n0001"], "evidence": [{"nodes": ["n0001", "nope"], "busbw_gbs": 3.0}]}),
            "\"nope\" is not a node of the fabric",
        ),
    ] {
        let (s, answer) = create(&api, &operator, body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {answer}");
        assert!(message(&answer).contains(want), "{body} -> {answer}");
    }
    let (s, answer) = create(&api, &operator, json!({"suspects": ["n0001"], "rounds": 3})).await;
    assert!(s.is_client_error(), "an unknown field is refused: {answer}");
    let (s, _) = create(&api, &viewer, json!({"suspects": ["n0001"]})).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // n0002 is busy with a run of its own: left out unless include_busy.
    let busy = server
        .start_run(json!({"kind": "memcpy", "nodes": ["n0002"]}))
        .await;
    let lease = agents[1].claim(&api).await;
    assert_eq!(lease["run_id"], json!(busy.id));

    let (s, body) = create(
        &api,
        &operator,
        json!({"suspects": ["n[0001-0008]", "n0016"], "label": "rack 1"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let inv: FabricInvestigation = serde_json::from_value(body).unwrap();
    assert_eq!(inv.round, 1);
    assert_eq!(inv.nodes_available, 11, "12 enrolled, one busy");
    assert_eq!(inv.suspects.len(), 7, "n0002 and n0016 left out");
    let notes = inv.notes.join("\n");
    assert!(
        notes.contains("n0002: left out") && notes.contains("busy"),
        "{notes}"
    );
    assert!(notes.contains("n0016: left out"), "{notes}");
    assert!(!inv.tests.is_empty());
    let mut seen = std::collections::BTreeSet::new();
    for t in &inv.tests {
        assert_eq!(t.state, FabricTestState::Running, "{t:?}");
        assert!(
            t.nodes.iter().all(|n| n != "n0002" && n != "n0016"),
            "{t:?}"
        );
        assert!(t.nodes.len() >= 2);
        let run = server.get_run(t.run_id.expect("a run")).await;
        assert_eq!(run.spec.kind, "nccl");
        assert_eq!(run.spec.params.raw()["op"], "all_reduce");
        let rail = t.rail.expect("first-round tests are on one rail");
        assert_eq!(run.spec.env["NCCL_IB_HCA"], format!("=mlx5_{rail}"));
        let hosts: Vec<&str> = run.jobs.iter().map(|j| j.hostname.as_str()).collect();
        assert_eq!(hosts, t.nodes, "ranked in the test's order");
        for n in &t.nodes {
            assert!(
                seen.insert((n.clone(), rail)),
                "{n} twice on rail {rail} in one round"
            );
        }
    }

    // Read back, and listed.
    let (s, body) = api
        .get(
            &format!("/api/v1/fabric/investigations/{}", inv.id),
            &viewer,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["tests"].as_array().unwrap().len(), inv.tests.len());
    let (s, list) = api.get("/api/v1/fabric/investigations", &viewer).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list[0]["id"], json!(inv.id));
    assert_eq!(list[0]["label"], "rack 1");
    let (s, body) = api
        .get(
            &format!("/api/v1/fabric/investigations/{}", uuid::Uuid::new_v4()),
            &viewer,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");

    // With include_busy, n0002 may be taken.
    let (s, body) = create(
        &api,
        &operator,
        json!({"suspects": ["n0002"], "include_busy": true, "suspects_only": false}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert_eq!(body["nodes_available"], 12, "{body}");
}

/// Answers every queued test of `agent` with a healthy figure.
async fn answer_all(api: &Api, credential: &str) {
    loop {
        let (s, lease) = api
            .post("/api/v1/agent/jobs/claim", credential, json!({}))
            .await;
        if s == StatusCode::NO_CONTENT {
            return;
        }
        assert_eq!(s, StatusCode::OK, "{lease}");
        assert_eq!(lease["spec"]["kind"], "nccl", "{lease}");
        let job = lease["job_id"].as_str().unwrap();
        let body = json!({"upload_key": uuid::Uuid::new_v4().to_string(), "outcome": "succeeded",
            "claim_id": lease["claim_id"], "rows": [{"size_bytes": 1i64 << 30, "busbw_gbs": 45.0}],
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:02Z"});
        let (s, answer) = api
            .post(
                &format!("/api/v1/agent/jobs/{job}/result"),
                credential,
                body,
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{answer}");
    }
}

/// A node that takes on a job of its own while an investigation runs is left out of the
/// next round: its tests are skipped, saying why, and are no evidence.
#[tokio::test]
async fn a_node_that_becomes_busy_is_left_out_of_the_next_round() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let fabric = fat_tree(&FatTree {
        nodes: 8,
        rails: 2,
        nodes_per_leaf: 4,
        spines_per_rail: 1,
    });
    let (s, body) = api
        .call(
            Method::PUT,
            "/api/v1/fabric",
            Some(&server.admin_token),
            Some(json!({"source": "heddle", "text": serde_json::to_string(&fabric).unwrap()})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let mut agents = Vec::new();
    for n in &fabric.nodes {
        let a = enroll(&api, &server, &n.name).await;
        heartbeat(&api, &a.credential).await;
        agents.push(a);
    }
    let (s, body) = create(
        &api,
        &server.admin_token,
        json!({"suspects": ["n[0001-0008]"]}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();

    // n0003 answers its round-1 tests, then takes on a run of its own; the others answer.
    answer_all(&api, &agents[2].credential).await;
    let own = server
        .start_run(json!({"kind": "memcpy", "nodes": ["n0003"]}))
        .await;
    let (s, lease) = agents[2].try_claim(&api).await;
    assert_eq!(
        (s, lease["run_id"].clone()),
        (StatusCode::OK, json!(own.id))
    );
    for (i, a) in agents.iter().enumerate() {
        if i != 2 {
            answer_all(&api, &a.credential).await;
        }
    }
    let path = format!("/api/v1/fabric/investigations/{id}");
    let start = std::time::Instant::now();
    let inv: FabricInvestigation = loop {
        let (s, body) = api.get(&path, &server.admin_token).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let inv: FabricInvestigation = serde_json::from_value(body).unwrap();
        if inv.round >= 2 {
            break inv;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "round 2 never started: {inv:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let round2: Vec<_> = inv.tests.iter().filter(|t| t.round == 2).collect();
    let busy: Vec<_> = round2
        .iter()
        .filter(|t| t.nodes.iter().any(|m| m == "n0003"))
        .collect();
    assert!(!busy.is_empty(), "round 2 tests n0003 again: {round2:?}");
    for t in busy {
        assert_eq!(t.state, FabricTestState::Skipped, "{t:?}");
        assert_eq!(t.run_id, None);
        let why = t.error.as_deref().unwrap_or_default();
        assert!(why.contains("n0003 is running a job"), "{why}");
    }
    let others: Vec<_> = round2
        .iter()
        .filter(|t| !t.nodes.iter().any(|m| m == "n0003"))
        .collect();
    assert!(!others.is_empty());
    assert!(
        others
            .iter()
            .all(|t| t.state == FabricTestState::Running && t.run_id.is_some()),
        "{others:?}"
    );
}
