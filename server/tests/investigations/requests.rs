//! What a request to start an investigation must get right before anything starts.

use super::*;

#[tokio::test]
async fn requests_are_checked() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    for h in ["chk-a", "chk-b"] {
        enroll(&api, &server, h).await;
    }
    let post = |body: Value| {
        let api = &api;
        let token = &token;
        async move { api.post("/api/v1/investigations", token, body).await }
    };
    let cases = [
        (
            json!({"nodes": ["chk-a"], "kind": "nccl"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "chk-a"], "kind": "nccl"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "nope"], "kind": "nccl"}),
            StatusCode::NOT_FOUND,
        ),
        (
            json!({"nodes": ["chk-a", "chk-b"], "kind": "ucx"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "chk-b"], "kind": "nccl", "threshold": 1.5}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "chk-b"], "kind": "nccl", "params": [1]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "chk-b"], "kind": "nccl", "env": {"1BAD": "x"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "chk-b\u{0}"], "kind": "nccl"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["chk-a", "chk-b"], "kind": "nccl", "label": "a\u{0}b"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (body, want) in cases {
        let (s, resp) = post(body.clone()).await;
        assert_eq!(s, want, "{body} → {resp}");
        error_code(&resp);
    }
    let (s, _) = api
        .get(
            &format!("/api/v1/investigations/{}", Uuid::new_v4()),
            &token,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api.get("/api/v1/investigations?state=bogus", &token).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let viewer = server.token(heddle_types::auth::Role::Viewer).await;
    let (s, _) = api
        .post(
            "/api/v1/investigations",
            &viewer,
            json!({"nodes": ["chk-a", "chk-b"], "kind": "nccl"}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Two nodes: one pair, nothing to compare it with, said so.
    let (s, body) =
        post(json!({"nodes": ["chk-a", "chk-b"], "kind": "nccl", "label": "two"})).await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert_eq!(body["pairs"].as_array().unwrap().len(), 1);
    let (_, audit) = api.get("/api/v1/audit", &token).await;
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "investigation.create"),
        "{audit}"
    );
    // The OpenAPI document names every schema once: ours do not shadow the verdicts' ones.
    let (_, doc) = api.get("/api/v1/openapi.json", &token).await;
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["Analysis"]["properties"]["verdict"]["$ref"], "#/components/schemas/Conclusion",
        "{}",
        schemas["Analysis"]
    );
    assert_eq!(
        schemas["Culprit"]["properties"]["figures"]["items"]["$ref"],
        "#/components/schemas/PairFigure"
    );
    assert!(
        schemas["InvestigationCreate"]["required"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "nodes")
    );
    assert!(doc["paths"]["/api/v1/results/{id}/p2p-matrix"]["get"].is_object());
}
