//! Transport reasons on uploaded results and the environment jobs are given, against a
//! real Postgres: a socket fallback on a node with an ACTIVE InfiniBand port fails, a
//! result without evidence warns, perftest below 90 % of its port fails with
//! `below-port-rate`, and a node's recommendation reaches its job's env unless the run
//! refuses it.

mod common;

use common::*;
use heddle_server::testing::TestServer;
use heddle_testkit::results::codes;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Enrolls `host` with the facts of the DGX-1 fixture: four ACTIVE 100 Gb/sec EDR ports.
async fn ib_node(api: &Api, server: &TestServer, host: &str) -> FakeAgent {
    let a = enroll(api, server, host).await;
    let mut facts = fixture_facts("dgx1");
    facts["host"]["hostname"] = json!(host);
    let (s, body) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&a.credential),
            Some(facts),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    a
}

async fn judged(
    api: &Api,
    server: &TestServer,
    agent: &FakeAgent,
    run: Value,
    body: Value,
) -> Value {
    let run = server.start_run(run).await;
    let lease = agent.claim(api).await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, up) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &agent.credential,
            body,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
    let (_, results) = api
        .get(
            &format!("/api/v1/runs/{}/results", run.id),
            &server.admin_token,
        )
        .await;
    results[0].clone()
}

fn nccl_body(key: &str, summary: Value) -> Value {
    json!({
        "upload_key": key, "outcome": "succeeded", "summary": summary,
        "rows": [{"size_bytes": 1 << 30, "op": "all_reduce", "busbw_gbs": 300.0, "algbw_gbs": 150.0, "wrong": 0}],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    })
}

#[tokio::test]
async fn the_slow_path_cannot_pass() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = ib_node(&api, &server, "ib-1").await;
    let nccl = json!({"kind": "nccl", "nodes": ["ib-1"]});

    // What the agent's parser makes of NCCL's log on a node where IB did not come up.
    let socket = json!({"kind": "nccl", "nccl_evidence": {
        "network": "Socket", "network_line": "Using network Socket",
        "ib_unavailable": ["NET/IB : No device found."], "channel_lines": 2,
        "transports": {"P2P": 2}, "channel_transports": ["P2P/CUMEM/read"]}});
    let r = judged(
        &api,
        &server,
        &agent,
        nccl.clone(),
        nccl_body("sock", socket),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    assert_eq!(codes(&r), [("socket-fallback".into(), "fail".into())]);
    let reason = &r["verdict"]["reasons"][0];
    assert_eq!(reason["evidence"], "Using network Socket");
    assert_eq!(reason["basis"], "transport");
    assert!(
        reason["message"]
            .as_str()
            .unwrap()
            .contains("NET/IB : No device found."),
        "{reason}"
    );

    // No evidence at all: a warning, never a pass.
    let r = judged(
        &api,
        &server,
        &agent,
        nccl.clone(),
        nccl_body("none", json!({})),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "warn", "{r}");
    assert_eq!(codes(&r), [("transport-unknown".into(), "warn".into())]);

    // IB with GPUDirect: nothing to say about the path.
    let ib = json!({"kind": "nccl", "nccl_evidence": {
        "network": "IB", "channel_lines": 4, "transports": {"NET/IB": 4},
        "channel_transports": ["NET/IB/0/GDRDMA"], "gdr": true,
        "devices": [{"name": "mlx5_0", "port": 1, "link_layer": "IB"}]}});
    let r = judged(&api, &server, &agent, nccl, nccl_body("ib", ib)).await;
    assert!(codes(&r).is_empty(), "{r}");
    assert_ne!(r["verdict"]["verdict"], "fail", "{r}");

    // perftest at 10 GB/s on a 100 Gb/sec port (the one its header names; the run's params
    // name another device): below 90 % of 12.5 GB/s.
    let rdma = json!({
        "upload_key": "rdma", "outcome": "succeeded",
        "summary": {"kind": "rdma", "perftest_evidence": {"device": "mlx5_0", "port": 1, "link_layer": "IB"}},
        "rows": [{"size_bytes": 1 << 20, "op": "ib_write_bw", "algbw_gbs": 10.0}],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    });
    let r = judged(
        &api,
        &server,
        &agent,
        json!({"kind": "rdma", "params": {"device": "mlx5_3"}, "nodes": ["ib-1"]}),
        rdma.clone(),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    assert_eq!(codes(&r), [("below-port-rate".into(), "fail".into())]);
    assert_eq!(r["verdict"]["reasons"][0]["expected"], 11.25);
    assert!(
        r["verdict"]["reasons"][0]["basis"]
            .as_str()
            .unwrap()
            .contains("mlx5_0 port 1"),
        "{r}"
    );

    // The same figure without perftest's own word on the port: no port-rate floor.
    let mut bare = rdma;
    bare["upload_key"] = json!("rdma-bare");
    bare["summary"] = json!({"kind": "rdma"});
    let r = judged(
        &api,
        &server,
        &agent,
        json!({"kind": "rdma", "params": {"device": "mlx5_0"}, "nodes": ["ib-1"]}),
        bare,
    )
    .await;
    assert!(codes(&r).is_empty(), "{r}");
}

#[tokio::test]
async fn jobs_get_the_nodes_environment_unless_refused() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = ib_node(&api, &server, "env-1").await;
    let (s, body) = api
        .call(
            Method::PUT,
            "/api/v1/nodes/env-1/recommendations",
            Some(&server.admin_token),
            Some(json!({"source": "site-policy", "items": [
                {"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": "the IB HCA"},
                {"name": "NCCL_ALGO", "value": "Tree", "reason": "overridden by the run"}
            ]})),
        )
        .await;
    assert!(s.is_success(), "{body}");
    let run = server
        .start_run(json!({"kind": "env", "env": {"NCCL_ALGO": "Ring"}, "nodes": ["env-1"]}))
        .await;
    let lease = agent.claim(&api).await;
    assert_eq!(
        lease["spec"]["env"],
        json!({"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "mlx5_0"})
    );
    let env = &run.jobs[0].applied_env;
    assert_eq!(env.len(), 2);
    assert_eq!(
        (env[0].name.as_str(), env[0].source.as_str()),
        ("NCCL_ALGO", "run")
    );
    assert_eq!(
        (env[1].name.as_str(), env[1].source.as_str()),
        ("NCCL_IB_HCA", "site-policy")
    );

    server
        .start_run(
            json!({"kind": "env", "env": {"NCCL_ALGO": "Ring"}, "nodes": ["env-1"],
                          "recommended_env": false}),
        )
        .await;
    let lease = agent.claim(&api).await;
    assert_eq!(lease["spec"]["env"], json!({"NCCL_ALGO": "Ring"}));
}
