//! Who may do what: every door of the API against every role, agent credentials and
//! revoked tokens.

use super::*;

#[tokio::test]
async fn auth_matrix() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let viewer = server.token(Role::Viewer).await;
    let operator = server.token(Role::Operator).await;
    let admin = server.admin_token.clone();
    let agent = enroll(&api, &server, "matrix-1").await;
    for (method, path, body, least) in doors() {
        only_its_roles_pass(
            &api,
            &agent,
            [&viewer, &operator, &admin],
            method,
            path,
            body,
            least,
        )
        .await;
    }
    agent_endpoints_refuse_api_tokens(&api, &admin).await;
    a_revoked_token_stops_at_once(&api, &admin, &viewer).await;
}

/// (method, path, body, least role that may do it)
fn doors() -> Vec<(Method, String, Option<Value>, Role)> {
    vec![
        (Method::GET, "/api/v1/whoami".into(), None, Role::Viewer),
        (Method::GET, "/api/v1/nodes".into(), None, Role::Viewer),
        (
            Method::GET,
            "/api/v1/nodes/matrix-1".into(),
            None,
            Role::Viewer,
        ),
        (
            Method::GET,
            "/api/v1/nodes/matrix-1/env".into(),
            None,
            Role::Viewer,
        ),
        (
            Method::GET,
            "/api/v1/nodes/matrix-1/facts/history".into(),
            None,
            Role::Viewer,
        ),
        (Method::GET, "/api/v1/runs".into(), None, Role::Viewer),
        (Method::GET, "/api/v1/run-kinds".into(), None, Role::Viewer),
        (Method::GET, "/api/v1/agents".into(), None, Role::Viewer),
        (Method::GET, "/api/v1/plugins".into(), None, Role::Viewer),
        (Method::GET, "/api/v1/sites".into(), None, Role::Viewer),
        (
            Method::GET,
            "/api/v1/tuning-profiles".into(),
            None,
            Role::Viewer,
        ),
        (
            Method::POST,
            "/api/v1/runs".into(),
            Some(json!({"kind": "memcpy", "nodes": ["matrix-1"]})),
            Role::Operator,
        ),
        (
            Method::POST,
            "/api/v1/sites".into(),
            Some(json!({"name": "s-auth"})),
            Role::Operator,
        ),
        (
            Method::PATCH,
            "/api/v1/nodes/matrix-1".into(),
            Some(json!({"site": null})),
            Role::Operator,
        ),
        (
            Method::PUT,
            "/api/v1/nodes/matrix-1/recommendations".into(),
            Some(json!({"source": "manual", "items": []})),
            Role::Operator,
        ),
        (
            Method::POST,
            "/api/v1/tuning-profiles".into(),
            Some(json!({"name": "p-auth", "node": "matrix-1", "env": {"NCCL_ALGO": "Ring"}})),
            Role::Operator,
        ),
        (Method::GET, "/api/v1/tokens".into(), None, Role::Admin),
        (
            Method::POST,
            "/api/v1/tokens".into(),
            Some(json!({"name": "t-auth", "role": "viewer"})),
            Role::Admin,
        ),
        (
            Method::GET,
            "/api/v1/enrollment-tokens".into(),
            None,
            Role::Admin,
        ),
        (
            Method::POST,
            "/api/v1/enrollment-tokens".into(),
            Some(json!({})),
            Role::Admin,
        ),
        (Method::GET, "/api/v1/audit".into(), None, Role::Admin),
        (
            Method::GET,
            "/api/v1/agents/pending".into(),
            None,
            Role::Admin,
        ),
        (
            Method::POST,
            "/api/v1/plugins/none/disable".into(),
            None,
            Role::Admin,
        ),
    ]
}

/// `method path` is refused without a token, with a bad one and with an agent's
/// credential, refused to the roles below `least` and let through to the others.
async fn only_its_roles_pass(
    api: &Api,
    agent: &FakeAgent,
    [viewer, operator, admin]: [&String; 3],
    method: Method,
    path: String,
    body: Option<Value>,
    least: Role,
) {
    let (s, b) = api.call(method.clone(), &path, None, body.clone()).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "{method} {path} without a token: {b}"
    );
    error_code(&b);
    let (s, _) = api
        .call(
            method.clone(),
            &path,
            Some("hdl_not-a-real-token"),
            body.clone(),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "{method} {path} with a bad token"
    );
    let (s, _) = api
        .call(method.clone(), &path, Some(&agent.credential), body.clone())
        .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "{method} {path} with an agent credential"
    );
    for (role, token) in [
        (Role::Viewer, &viewer),
        (Role::Operator, &operator),
        (Role::Admin, &admin),
    ] {
        let (s, b) = api
            .call(method.clone(), &path, Some(token), body.clone())
            .await;
        if role < least {
            assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path} as {role}: {b}");
            assert_eq!(error_code(&b), "forbidden");
        } else {
            assert!(
                s != StatusCode::UNAUTHORIZED && s != StatusCode::FORBIDDEN,
                "{method} {path} as {role}: {s} {b}"
            );
            assert!(!s.is_server_error(), "{method} {path} as {role}: {s} {b}");
        }
    }
}

/// Agent endpoints refuse API tokens and nonsense.
async fn agent_endpoints_refuse_api_tokens(api: &Api, admin: &str) {
    for token in [admin, "hda_forged"] {
        let (s, _) = api.post("/api/v1/agent/heartbeat", token, json!({})).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
}

/// A revoked token stops working at once.
async fn a_revoked_token_stops_at_once(api: &Api, admin: &str, viewer: &str) {
    let (_, tokens) = api.get("/api/v1/tokens", admin).await;
    let viewer_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == "viewer")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/tokens/{viewer_id}"),
            Some(admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        api.get("/api/v1/whoami", viewer).await.0,
        StatusCode::UNAUTHORIZED
    );
}
