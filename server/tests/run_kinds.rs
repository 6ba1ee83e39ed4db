//! The run-kinds catalogue and the typed params behind it, against a real server and
//! Postgres: the catalogue describes every kind's parameters, and a run whose kind or
//! params do not decode is refused with 422 naming what is wrong, before any job exists.

mod common;

use common::{Api, enroll, error_code};
use heddle_server::testing::TestServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test]
async fn catalogue_and_typed_params() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    enroll(&api, &server, "kinds-1").await;

    let (s, kinds) = api.get("/api/v1/run-kinds", &admin).await;
    assert_eq!(s, StatusCode::OK, "{kinds}");
    let kinds = kinds.as_array().unwrap();
    let names: Vec<&str> = kinds.iter().map(|k| k["name"].as_str().unwrap()).collect();
    for want in [
        "nccl", "sweep", "p2p", "rdma", "ucx", "memcpy", "env", "sleep", "fail",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let nccl = kinds.iter().find(|k| k["name"] == "nccl").unwrap();
    let param = |name: &str| -> Value {
        nccl["params"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("nccl has no {name}"))
    };
    assert_eq!(param("iters")["default"], 20);
    assert_eq!(param("iters")["unit"], "iterations");
    assert_eq!(param("iters")["min"], 1.0);
    assert_eq!(param("max_bytes")["default"], 128u64 << 20);
    assert_eq!(param("op")["type"], "string");
    assert!(
        param("op")["choices"]
            .as_array()
            .unwrap()
            .contains(&json!("all_reduce"))
    );
    let sweep = kinds.iter().find(|k| k["name"] == "sweep").unwrap();
    let grid = sweep["params"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "grid")
        .unwrap();
    assert_eq!(
        (grid["type"].clone(), grid["required"].clone()),
        (json!("env_grid"), json!(true))
    );
    // The catalogue is part of the OpenAPI document.
    let (_, doc) = api.get("/api/v1/openapi.json", &admin).await;
    assert!(doc["paths"]["/api/v1/run-kinds"]["get"].is_object());

    let refused = |body: Value, names: &'static [&'static str]| {
        let api = &api;
        let admin = admin.clone();
        async move {
            let (s, b) = api.post("/api/v1/runs", &admin, body.clone()).await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {b}");
            assert_eq!(error_code(&b), "unprocessable");
            let msg = b["message"].as_str().unwrap();
            for n in names {
                assert!(msg.contains(n), "{body}: {msg} does not name {n}");
            }
        }
    };
    refused(
        json!({"kind": "warp-drive", "nodes": ["kinds-1"]}),
        &["warp-drive", "nccl", "memcpy"],
    )
    .await;
    refused(
        json!({"kind": "nccl", "nodes": ["kinds-1"], "params": {"iters": 0}}),
        &["params.iters"],
    )
    .await;
    refused(
        json!({"kind": "nccl", "nodes": ["kinds-1"], "params": {"minbytes": 8}}),
        &["params.minbytes", "min_bytes"],
    )
    .await;
    refused(
        json!({"kind": "nccl", "nodes": ["kinds-1"], "params": {"dtype": "complex"}}),
        &["params.dtype", "bfloat16"],
    )
    .await;
    refused(
        json!({"kind": "memcpy", "nodes": ["kinds-1"], "params": {"iters": "lots"}}),
        &["params.iters"],
    )
    .await;
    refused(
        json!({"kind": "sleep", "nodes": ["kinds-1"], "params": {}}),
        &["seconds"],
    )
    .await;
    refused(
        json!({"kind": "rdma", "nodes": ["kinds-1"], "params": {"test": "ib_write_bw; reboot"}}),
        &["params.test"],
    )
    .await;
    refused(json!({"kind": "sweep", "nodes": ["kinds-1"], "params": {"grid": {"NCCL_ALGO": ["Ring"]}, "gpus": 99}}), &["params.gpus"]).await;
    let (_, runs) = api.get("/api/v1/runs", &admin).await;
    assert_eq!(
        runs.as_array().map(Vec::len),
        Some(0),
        "nothing was stored: {runs}"
    );

    // Accepted params are stored as sent, with the collective in its one spelling.
    let run = server
        .start_run(json!({"kind": "nccl", "nodes": ["kinds-1"], "params": {"op": "AllReduce", "iters": 5, "budget": "10s"}}))
        .await;
    assert_eq!(
        run.spec.params,
        json!({"op": "all_reduce", "iters": 5, "budget": "10s"})
    );
}
