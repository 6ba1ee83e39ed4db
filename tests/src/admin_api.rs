//! The API as the admin (and as an agent) from the end-to-end tests, for what a test sets up
//! rather than checks.

use serde_json::{Value, json};

/// The admin's side of the API, and an agent's where a test makes a node's history by hand.
pub struct AdminApi {
    pub url: String,
    pub admin: String,
    pub http: reqwest::Client,
}

impl AdminApi {
    pub fn new(url: &str, admin: &str) -> AdminApi {
        AdminApi {
            url: url.into(),
            admin: admin.into(),
            http: reqwest::Client::new(),
        }
    }

    /// `METHOD path` with `body`, as `bearer` (none when empty); panics unless it succeeds.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: &str,
        body: Value,
    ) -> Value {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .json(&body);
        if !bearer.is_empty() {
            req = req.bearer_auth(bearer);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    pub async fn post(&self, path: &str, bearer: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, bearer, body).await
    }

    /// An enrollment token, bound to `node` when given.
    pub async fn enrollment_token(&self, node: Option<&str>) -> String {
        let v = self
            .post(
                "/api/v1/enrollment-tokens",
                &self.admin,
                json!({"node": node}),
            )
            .await;
        v["token"].as_str().unwrap().to_string()
    }

    /// Enrolls `host` by the agent protocol and uploads memcpy results of `history`
    /// (GB/s), each judged on arrival: what the node's verdict is made of.
    pub async fn node_with_history(&self, host: &str, history: &[f64]) {
        let token = self.enrollment_token(None).await;
        let enrolled = self
            .post(
                "/api/v1/agent/enroll",
                "",
                json!({"enroll_token": token, "hostname": host}),
            )
            .await;
        let cred = enrolled["credential"].as_str().unwrap().to_string();
        for (i, gbs) in history.iter().enumerate() {
            self.post(
                "/api/v1/runs",
                &self.admin,
                json!({"kind": "memcpy", "nodes": [host]}),
            )
            .await;
            let lease = self
                .post("/api/v1/agent/jobs/claim", &cred, json!({}))
                .await;
            let job = lease["job_id"]
                .as_str()
                .expect("the memcpy job")
                .to_string();
            let body = json!({"upload_key": format!("{host}-{i}"), "outcome": "succeeded",
                "rows": [{"size_bytes": 64 << 20, "op": "memcpy", "algbw_gbs": gbs, "wrong": 0}],
                "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
            self.post(&format!("/api/v1/agent/jobs/{job}/result"), &cred, body)
                .await;
        }
    }
}
