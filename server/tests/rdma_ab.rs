//! `rdma_ab` results against a real Postgres: an RDMA leg clearly faster than sockets on a
//! node with ACTIVE InfiniBand ports passes; one that is not fails with
//! `rdma-not-helping`; an operator's expectation moves the threshold; a node without an
//! ACTIVE port is told so instead of passing by silence.

mod common;

use common::*;
use heddle_server::testing::TestServer;
use heddle_testkit::results::codes;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Enrolls `host` with the DGX-1 fixture's facts (four ACTIVE 100 Gb/sec EDR ports), or
/// with the same facts stripped of every RDMA device.
async fn node(api: &Api, server: &TestServer, host: &str, with_hcas: bool) -> FakeAgent {
    let a = enroll(api, server, host).await;
    let mut facts = fixture_facts("dgx1");
    facts["host"]["hostname"] = json!(host);
    if !with_hcas {
        facts["rdma"]["devices"] = json!([]);
    }
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

/// Sizes (bytes) and busbw (GB/s) of the two legs: seed 003's 16-GPU figures at the large
/// sizes (122.3 with RDMA, 29.1 without), scaled by `rdma_scale` on the RDMA side.
fn body(key: &str, rdma_scale: f64) -> Value {
    let table = [
        (1i64 << 20, 25.4, 6.8),
        (16 << 20, 88.0, 21.7),
        (64 << 20, 116.5, 27.9),
        (128 << 20, 122.3, 29.1),
    ];
    let mut rows = Vec::new();
    for (leg, pick) in [("rdma", 0), ("socket", 1)] {
        for (size, rdma, socket) in table {
            let bw = if pick == 0 { rdma * rdma_scale } else { socket };
            rows.push(
                json!({"size_bytes": size, "op": "all_reduce", "busbw_gbs": bw,
                "algbw_gbs": bw / 1.875, "wrong": 0, "labels": {"leg": leg}}),
            );
        }
    }
    let parsed: Vec<heddle_types::jobs::ResultRow> =
        serde_json::from_value(Value::Array(rows.clone())).unwrap();
    let comparison = heddle_types::kinds::rdma_ab::AbComparison::from_rows(&parsed);
    let summary = json!({
        "kind": "rdma_ab", "collective": "all_reduce", "nranks": 16,
        "legs": {
            "rdma": {"nccl_evidence": {"network": "IB", "network_line": "Using network IB",
                "devices": [{"name": "mlx5_0", "port": 1, "link_layer": "IB"}],
                "transports": {"NET/IB": 8, "P2P": 16}, "channel_transports": ["NET/IB/0/GDRDMA"],
                "gdr": true, "channel_lines": 24}},
            "socket": {"nccl_evidence": {"network": "Socket", "network_line": "Using network Socket",
                "transports": {"NET/Socket": 8, "P2P": 16}, "channel_transports": ["NET/Socket/0"],
                "env": {"NCCL_IB_DISABLE": "1"}, "channel_lines": 24}}
        },
        "comparison": comparison
    });
    json!({
        "upload_key": key, "outcome": "succeeded", "summary": summary, "rows": rows,
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    })
}

async fn judged(
    api: &Api,
    server: &TestServer,
    agent: &FakeAgent,
    host: &str,
    body: Value,
) -> Value {
    let run = server
        .start_run(json!({"kind": "rdma_ab", "params": {"op": "allreduce"}, "nodes": [host]}))
        .await;
    assert_eq!(
        run.spec.params["op"], "all_reduce",
        "the collective's name is normalised"
    );
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

#[tokio::test]
async fn rdma_that_does_not_help_fails_where_the_facts_say_it_should() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let ib = node(&api, &server, "ab-ib", true).await;

    // Seed 003's table: RDMA 4.2× the sockets at 128 MiB. Both legs' rows are stored.
    let r = judged(&api, &server, &ib, "ab-ib", body("good", 1.0)).await;
    assert_eq!(r["verdict"]["verdict"], "pass", "{r}");
    assert!(codes(&r).is_empty(), "{r}");
    assert_eq!(r["rows"].as_array().unwrap().len(), 8);
    let legs: Vec<&str> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["labels"]["leg"].as_str().unwrap())
        .collect();
    assert_eq!(legs.iter().filter(|l| **l == "socket").count(), 4);
    let f = &r["verdict"]["figures"][0];
    assert_eq!(
        (f["test"].as_str(), f["metric"].as_str()),
        (Some("rdma_ab.all_reduce"), Some("rdma_speedup"))
    );
    assert_eq!(f["size_bytes"], 128 << 20);

    // An RDMA leg barely faster than sockets (1.1×) on a node with ACTIVE IB ports.
    let r = judged(&api, &server, &ib, "ab-ib", body("slow", 0.26)).await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    assert_eq!(codes(&r), [("rdma-not-helping".into(), "fail".into())]);
    let reason = &r["verdict"]["reasons"][0];
    assert_eq!(
        reason["expected"],
        heddle_types::kinds::rdma_ab::MIN_SPEEDUP,
        "{reason}"
    );
    assert!(
        reason["message"].as_str().unwrap().contains("×"),
        "{reason}"
    );

    // An operator asks for 5×: seed 003's 4.2× no longer passes.
    let (s, e) = api
        .post(
            "/api/v1/expectations",
            &server.admin_token,
            json!({"test": "rdma_ab.all_reduce", "metric": "rdma_speedup", "value": 5.0,
                   "min_size_bytes": 64 << 20, "source": "acceptance test of this fabric"}),
        )
        .await;
    assert!(s.is_success(), "{e}");
    let r = judged(&api, &server, &ib, "ab-ib", body("strict", 1.0)).await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    assert_eq!(codes(&r), [("rdma-not-helping".into(), "fail".into())]);
    assert_eq!(r["verdict"]["reasons"][0]["expected"], 5.0);
}

#[tokio::test]
async fn a_node_without_an_active_port_is_told_so() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let bare = node(&api, &server, "ab-bare", false).await;
    let r = judged(&api, &server, &bare, "ab-bare", body("bare", 0.26)).await;
    assert_eq!(r["verdict"]["verdict"], "warn", "{r}");
    assert_eq!(codes(&r), [("rdma-ab-inconclusive".into(), "warn".into())]);
    let message = r["verdict"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["code"] == "rdma-ab-inconclusive")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("no ACTIVE InfiniBand or RoCE port"),
        "{message}"
    );
}
