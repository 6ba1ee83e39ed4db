//! A sweep's result read as cells × size bands, and its winner kept as a tuning profile
//! that reaches the node's env export. The result is uploaded by a fake agent through the
//! agent protocol, with rows shaped like the `sweep` kind's (one set per cell, labelled).

mod common;

use common::*;
use heddle_server::testing::TestServer;
use heddle_types::auth::Role;
use heddle_types::jobs::Run;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// busbw of an all_reduce on 2× H200 (docs/benchmarks.md), scaled per cell: Ring/Simple is
/// the reference, Tree/LL is better below 64 KiB and worse above, Ring/LL128 counted wrong
/// elements (it must not win even with the best figures).
fn sweep_rows() -> Vec<Value> {
    let reference = [
        (8u64, 0.00),
        (1024, 0.10),
        (32768, 3.71),
        (1 << 20, 74.00),
        (16 << 20, 216.30),
        (64 << 20, 262.50),
        (256 << 20, 301.78),
        (1 << 30, 326.11),
    ];
    let cells: [(&str, &str, f64, f64, i64); 3] = [
        ("Ring", "Simple", 1.0, 1.0, 0),
        ("Tree", "LL", 1.6, 0.55, 0),
        ("Ring", "LL128", 2.0, 1.2, 512),
    ];
    let mut rows = Vec::new();
    for (algo, proto, small_factor, big_factor, wrong) in cells {
        for (size, busbw) in reference {
            let factor = if size < 64 << 10 {
                small_factor
            } else {
                big_factor
            };
            let time_us = if busbw > 0.0 {
                size as f64 / (busbw * factor) / 1e3
            } else {
                6.9
            };
            for in_place in [false, true] {
                rows.push(json!({
                    "size_bytes": size, "count": size / 4, "dtype": "float", "op": "all_reduce", "root": -1,
                    "in_place": in_place, "time_us": time_us, "algbw_gbs": busbw * factor, "busbw_gbs": busbw * factor,
                    "wrong": if size == 1 << 30 { wrong } else { 0 },
                    "labels": {"NCCL_ALGO": algo, "NCCL_PROTO": proto},
                    "extra": {"redop": "sum", "nranks": 2},
                }));
            }
        }
    }
    rows
}

async fn upload(api: &Api, agent: &FakeAgent, key: &str, outcome: &str, rows: Vec<Value>) {
    let lease = agent.claim(api).await;
    let job = lease["job_id"].as_str().unwrap();
    let body = json!({
        "upload_key": key, "outcome": outcome,
        "reason": if outcome == "skipped" { json!("NCCL unavailable: no CUDA driver") } else { Value::Null },
        "summary": {"kind": "sweep", "collective": "all_reduce"},
        "rows": rows,
        "started_at": "2026-11-23T10:00:00Z", "finished_at": "2026-11-23T10:04:00Z",
    });
    let (s, r) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &agent.credential,
            body,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
}

fn sweep_spec(node: &str) -> Value {
    json!({"kind": "sweep", "params": {"op": "all_reduce", "min_bytes": 8, "max_bytes": 1073741824, "factor": 32,
        "grid": {"NCCL_ALGO": ["Ring", "Tree"], "NCCL_PROTO": ["Simple", "LL", "LL128"]}}, "nodes": [node]})
}

#[tokio::test]
async fn sweep_table_winners_and_keep() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let operator = server.token(Role::Operator).await;
    let viewer = server.token(Role::Viewer).await;
    let agent = enroll(&api, &server, "sweep-1").await;
    let run = server.start_run(sweep_spec("sweep-1")).await;
    let sweep = format!("/api/v1/runs/{}/sweep", run.id);
    no_result_yet_is_a_conflict(&api, &viewer, &sweep).await;
    upload(&api, &agent, "sweep-1-k", "succeeded", sweep_rows()).await;
    the_table_and_its_winners(&api, &viewer, &sweep).await;
    the_large_winner_kept_for_the_node(
        &api,
        [admin.as_str(), &operator, &viewer],
        &agent,
        &run,
        &sweep,
    )
    .await;
    a_taken_name_or_unknown_band_is_refused(&api, &operator, &sweep).await;
    kept_for_the_site_once_the_node_has_one(&api, [admin.as_str(), &operator, &viewer], &sweep)
        .await;
}

/// No result yet: 409, with the job's state.
async fn no_result_yet_is_a_conflict(api: &Api, viewer: &str, sweep: &str) {
    let (s, body) = api.get(sweep, viewer).await;
    assert_eq!(
        (s, error_code(&body)),
        (StatusCode::CONFLICT, "conflict"),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("queued"),
        "{body}"
    );
}

/// Each cell's bandwidth by band, and each band's winner with its runner-up.
async fn the_table_and_its_winners(api: &Api, viewer: &str, sweep: &str) {
    let (s, t) = api.get(sweep, viewer).await;
    assert_eq!(s, StatusCode::OK, "{t}");
    assert_eq!(t["hostname"], "sweep-1");
    assert_eq!(t["collective"], "all_reduce");
    let cells = t["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3);
    assert_eq!(
        cells[0]["env"],
        json!({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    );
    assert_eq!(cells[0]["rows"], 16);
    // large: mean of 64M, 256M and 1G (both modes).
    let large = (262.50 + 301.78 + 326.11) / 3.0;
    assert!(
        (cells[0]["busbw_gbs"]["large"].as_f64().unwrap() - large).abs() < 1e-9,
        "{t}"
    );
    assert_eq!(cells[2]["wrong"], 1024);
    let winners: Vec<(String, String, String)> = t["winners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["band"].as_str().unwrap().into(),
                w["env"]["NCCL_ALGO"].as_str().unwrap().into(),
                w["env"]["NCCL_PROTO"].as_str().unwrap().into(),
            )
        })
        .collect();
    let w = |b: &str, a: &str, p: &str| (b.to_string(), a.to_string(), p.to_string());
    assert_eq!(
        winners,
        vec![
            w("small", "Tree", "LL"),
            w("medium", "Ring", "Simple"),
            w("large", "Ring", "Simple")
        ]
    );
    assert!((t["winners"][2]["runner_up_busbw_gbs"].as_f64().unwrap() - large * 0.55).abs() < 1e-9);
}

/// Keep the large winner for the node: operator only, audit-logged, in the env export.
async fn the_large_winner_kept_for_the_node(
    api: &Api,
    [admin, operator, viewer]: [&str; 3],
    agent: &FakeAgent,
    run: &Run,
    sweep: &str,
) {
    let keep = format!("{sweep}/keep");
    let (s, body) = api.post(&keep, viewer, json!({"name": "h200-large"})).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let (s, p) = api
        .post(&keep, operator, json!({"name": "h200-large"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    assert_eq!(
        p["env"],
        json!({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})
    );
    assert_eq!(p["source_run_id"], json!(run.id));
    assert_eq!(p["node_id"], json!(agent.node_id));
    assert_eq!(p["site_id"], Value::Null);
    let (s, env) = api.get("/api/v1/nodes/sweep-1/env", viewer).await;
    assert_eq!(s, StatusCode::OK);
    let env = env.as_str().unwrap();
    assert!(
        env.contains("export NCCL_ALGO=Ring\n") && env.contains("export NCCL_PROTO=Simple\n"),
        "{env}"
    );
    assert!(env.contains("tuning:h200-large"), "{env}");
    let (_, audit) = api.get("/api/v1/audit?action=tuning_profile.", admin).await;
    let entry = &audit[0];
    assert_eq!(entry["target"], "tuning_profile:h200-large");
    assert_eq!(entry["detail"]["from_sweep"], json!(run.id));
    assert_eq!(entry["detail"]["band"], "large");
}

/// The same name again: 409; a band name that does not exist: 422.
async fn a_taken_name_or_unknown_band_is_refused(api: &Api, operator: &str, sweep: &str) {
    let keep = format!("{sweep}/keep");
    let (s, body) = api
        .post(
            &keep,
            operator,
            json!({"name": "h200-large", "band": "small"}),
        )
        .await;
    assert_eq!(
        (s, error_code(&body)),
        (StatusCode::CONFLICT, "conflict"),
        "{body}"
    );
    let (s, body) = api
        .post(&keep, operator, json!({"name": "x", "band": "huge"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

/// Site scope: refused while the node has no site, then kept for the site; the node's own
/// profile still wins over the site's in the export.
async fn kept_for_the_site_once_the_node_has_one(
    api: &Api,
    [admin, operator, viewer]: [&str; 3],
    sweep: &str,
) {
    let keep = format!("{sweep}/keep");
    let (s, body) = api
        .post(
            &keep,
            operator,
            json!({"name": "site-small", "band": "small", "scope": "site"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("no site"),
        "{body}"
    );
    let (s, body) = api
        .post("/api/v1/sites", admin, json!({"name": "dc-1"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, body) = api
        .call(
            Method::PATCH,
            "/api/v1/nodes/sweep-1",
            Some(admin),
            Some(json!({"site": "dc-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{body}");
    let (s, p) = api
        .post(
            &keep,
            operator,
            json!({"name": "site-small", "band": "small", "scope": "site"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    assert_eq!(p["env"], json!({"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}));
    assert_eq!(
        (p["node_id"].clone(), p["site_id"].is_string()),
        (Value::Null, true)
    );
    // The node's own profile still wins over the site's in the export.
    let (_, env) = api.get("/api/v1/nodes/sweep-1/env", viewer).await;
    assert!(
        env.as_str().unwrap().contains("export NCCL_ALGO=Ring\n"),
        "{env}"
    );
}

#[tokio::test]
async fn sweep_errors_name_the_problem() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let operator = server.token(Role::Operator).await;
    let agent = enroll(&api, &server, "sweep-2").await;

    let (s, body) = api
        .get(
            "/api/v1/runs/00000000-0000-0000-0000-000000000009/sweep",
            &operator,
        )
        .await;
    assert_eq!(
        (s, error_code(&body)),
        (StatusCode::NOT_FOUND, "not_found"),
        "{body}"
    );
    let (s, body) = api
        .post(
            "/api/v1/runs/00000000-0000-0000-0000-000000000009/sweep/keep",
            &operator,
            json!({"name": "a"}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");

    // Not a sweep: 422.
    let nccl = server
        .start_run(json!({"kind": "nccl", "params": {}, "nodes": ["sweep-2"]}))
        .await;
    let (s, body) = api
        .get(&format!("/api/v1/runs/{}/sweep", nccl.id), &operator)
        .await;
    assert_eq!(
        (s, error_code(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable"),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("nccl run, not a sweep"),
        "{body}"
    );
    upload(&api, &agent, "nccl-k", "succeeded", vec![]).await;

    // A sweep that was skipped has no rows: 409 with the agent's reason.
    let run = server.start_run(sweep_spec("sweep-2")).await;
    upload(&api, &agent, "skip-k", "skipped", vec![]).await;
    let (s, body) = api
        .get(&format!("/api/v1/runs/{}/sweep", run.id), &operator)
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("NCCL unavailable"),
        "{body}"
    );

    // Only small sizes measured: keeping the large band is refused, small works.
    let run = server.start_run(sweep_spec("sweep-2")).await;
    let small: Vec<Value> = sweep_rows()
        .into_iter()
        .filter(|r| r["size_bytes"].as_u64().unwrap() < 64 << 10)
        .collect();
    upload(&api, &agent, "small-k", "succeeded", small).await;
    let keep = format!("/api/v1/runs/{}/sweep/keep", run.id);
    let (s, body) = api.post(&keep, &operator, json!({"name": "big"})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("large band"),
        "{body}"
    );
    let (s, body) = api
        .post(
            &keep,
            &operator,
            json!({"name": "bad name!", "band": "small"}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (s, body) = api
        .post(&keep, &operator, json!({"name": "tiny", "band": "small"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    // Without the 1 GiB rows LL128 counted nothing wrong, so its small figures win.
    assert_eq!(body["env"]["NCCL_PROTO"], "LL128");
}
