//! The p2p matrix investigation: one node's GPU-to-GPU copies, the slow GPU named.

use super::*;

#[tokio::test]
async fn p2p_matrix_names_the_bad_gpu() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    let agent = enroll(&api, &server, "gpu-node").await;
    let run = server
        .start_run(json!({"kind": "p2p", "nodes": ["gpu-node"]}))
        .await;
    let (_, lease) = agent.try_claim(&api).await;
    let job = lease["job_id"].as_str().unwrap();
    let mut rows = Vec::new();
    for s in 0..8 {
        for d in 0..8 {
            let (path, bw) = if s == d {
                ("local", 1400.0)
            } else if s == 5 || d == 5 {
                ("p2p", 30.0)
            } else {
                ("p2p", 330.0 + f64::from(s + d))
            };
            rows.push(json!({"size_bytes": 1 << 28, "algbw_gbs": bw, "labels": {"src": s.to_string(), "dst": d.to_string(), "kind": "d2d", "path": path}}));
        }
        rows.push(json!({"size_bytes": 1 << 28, "algbw_gbs": 25.0, "labels": {"src": "host", "dst": s.to_string(), "kind": "h2d", "path": "staged"}}));
    }
    let body = json!({"upload_key": "p2p-1", "outcome": "succeeded", "rows": rows,
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
    let (s, up) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &agent.credential,
            body,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
    let result = up["result_id"].as_str().unwrap();
    let (s, m) = api
        .get(&format!("/api/v1/results/{result}/p2p-matrix"), &token)
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(m["hostname"], "gpu-node");
    assert_eq!(m["matrix"]["labels"].as_array().unwrap().len(), 8);
    assert_eq!(m["matrix"]["values"][5][5], 1400.0);
    assert_eq!(m["paths"][0][1], "p2p");
    assert_eq!(m["analysis"]["verdict"], "culprit");
    assert_eq!(m["analysis"]["culprits"][0]["kind"], "node");
    assert_eq!(m["analysis"]["culprits"][0]["members"], json!(["5"]));
    assert!(
        m["analysis"]["summary"]
            .as_str()
            .unwrap()
            .starts_with("GPU 5 is bad"),
        "{m}"
    );
    let (s, _) = api
        .get(
            &format!("/api/v1/results/{result}/p2p-matrix?threshold=2"),
            &token,
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let (s, _) = api
        .get(
            &format!("/api/v1/results/{}/p2p-matrix", Uuid::new_v4()),
            &token,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // A result without p2p rows.
    let other = server
        .start_run(json!({"kind": "nccl", "nodes": ["gpu-node"]}))
        .await;
    let (_, lease) = agent.try_claim(&api).await;
    assert_eq!(lease["run_id"], other.id.to_string());
    let (_, up) = api
        .post(
            &format!(
                "/api/v1/agent/jobs/{}/result",
                lease["job_id"].as_str().unwrap()
            ),
            &agent.credential,
            result_body("nccl-1", "succeeded"),
        )
        .await;
    let (s, body) = api
        .get(
            &format!(
                "/api/v1/results/{}/p2p-matrix",
                up["result_id"].as_str().unwrap()
            ),
            &token,
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let _ = run;
}
