//! A small HTTP client for the API tests.
#![allow(dead_code)]

use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(server: &TestServer) -> Self {
        Api {
            base: server.url.clone(),
            http: reqwest::Client::new(),
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// An enrolled agent: its credential and node.
pub struct FakeAgent {
    pub credential: String,
    pub node_id: String,
    pub agent_id: String,
}

pub async fn enroll(api: &Api, server: &TestServer, hostname: &str) -> FakeAgent {
    let token = server.enrollment_token().await;
    let (status, body) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(json!({"enroll_token": token, "hostname": hostname, "agent_version": "test"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    FakeAgent {
        credential: body["credential"].as_str().unwrap().to_string(),
        node_id: body["node_id"].as_str().unwrap().to_string(),
        agent_id: body["agent_id"].as_str().unwrap().to_string(),
    }
}

pub fn result_body(key: &str, outcome: &str) -> Value {
    json!({
        "upload_key": key,
        "outcome": outcome,
        "summary": {"tool": "test"},
        "rows": [
            {"size_bytes": 8, "count": 2, "dtype": "float", "op": "sum", "time_us": 10.5, "algbw_gbs": 0.0, "busbw_gbs": 0.0, "wrong": 0},
            {"size_bytes": 1048576, "count": 262144, "dtype": "float", "op": "sum", "time_us": 20.0, "algbw_gbs": 52.4, "busbw_gbs": 52.4, "wrong": 0,
             "labels": {"NCCL_ALGO": "Ring"}}
        ],
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z"
    })
}

/// Asserts the `{error, message}` shape and returns the error code.
pub fn error_code(body: &Value) -> &str {
    assert!(
        body["message"].is_string(),
        "error body without message: {body}"
    );
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("error body without code: {body}"))
}

/// A component built by scripts/build-plugins.sh.
pub fn dist(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/dist")
        .join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build the plugins first: scripts/build-plugins.sh",
            path.display()
        )
    })
}

/// Facts of a fixture the plugins are tested with.
pub fn fixture_facts(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/fixtures")
        .join(format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// One pass of the plugin reconciler on this replica's state, as its worker runs it.
pub async fn reconcile(state: &heddle_server::AppState) -> anyhow::Result<usize> {
    let hold = std::time::Duration::from_millis(state.config.reconciler_hold_ms);
    heddle_server::plugins::reconcile(&state.db, &state.plugins, &state.job_env_seen, hold).await
}
