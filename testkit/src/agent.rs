//! An agent played by hand over the agent protocol: enrolled, then claiming jobs, sending
//! facts and uploading results as the test says, with no `heddle-agent` process.

use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::api::Api;

/// An enrolled agent: its credential and node.
pub struct FakeAgent {
    pub credential: String,
    pub node_id: String,
    pub agent_id: String,
}

/// `POST /api/v1/agent/enroll` with `token` as `hostname`: the answer, whatever it is.
pub async fn enroll_with(api: &Api, token: &str, hostname: &str) -> (StatusCode, Value) {
    api.call(
        Method::POST,
        "/api/v1/agent/enroll",
        None,
        Some(json!({"enroll_token": token, "hostname": hostname, "agent_version": "test"})),
    )
    .await
}

/// `hostname` enrolled with a fresh enrollment token.
pub async fn enroll(api: &Api, server: &TestServer, hostname: &str) -> FakeAgent {
    let token = server.enrollment_token().await;
    FakeAgent::enrolled_with(api, &token, hostname).await
}

impl FakeAgent {
    /// `hostname` enrolled with `token`; panics unless the server enrolled it.
    pub async fn enrolled_with(api: &Api, token: &str, hostname: &str) -> FakeAgent {
        let (status, body) = enroll_with(api, token, hostname).await;
        assert_eq!(status, StatusCode::CREATED, "enrolling {hostname}: {body}");
        FakeAgent {
            credential: body["credential"].as_str().unwrap().to_string(),
            node_id: body["node_id"].as_str().unwrap().to_string(),
            agent_id: body["agent_id"].as_str().unwrap().to_string(),
        }
    }

    /// An agent known by its credential alone (enrolled by the test some other way).
    pub fn with_credential(credential: &str) -> FakeAgent {
        FakeAgent {
            credential: credential.into(),
            node_id: String::new(),
            agent_id: String::new(),
        }
    }

    /// `POST /api/v1/agent/jobs/claim`: the answer, whatever it is (204: nothing queued).
    pub async fn try_claim(&self, api: &Api) -> (StatusCode, Value) {
        api.call(
            Method::POST,
            "/api/v1/agent/jobs/claim",
            Some(&self.credential),
            None,
        )
        .await
    }

    /// The lease of the next job; panics unless one was queued for this node.
    pub async fn claim(&self, api: &Api) -> Value {
        let (s, lease) = self.try_claim(api).await;
        assert_eq!(s, StatusCode::OK, "{lease}");
        lease
    }

    /// The lease of the next job, or `None` when none is queued for this node.
    pub async fn next_job(&self, api: &Api) -> Option<Value> {
        let (s, lease) = self.try_claim(api).await;
        if s == StatusCode::NO_CONTENT {
            return None;
        }
        assert_eq!(s, StatusCode::OK, "{lease}");
        Some(lease)
    }

    /// Uploads `body` as the result of `job`; panics unless the server stored it. Returns
    /// the server's answer.
    pub async fn upload(&self, api: &Api, job: &str, body: Value) -> Value {
        let (s, up) = api
            .post(
                &format!("/api/v1/agent/jobs/{job}/result"),
                &self.credential,
                body,
            )
            .await;
        assert_eq!(
            s,
            StatusCode::CREATED,
            "uploading the result of job {job}: {up}"
        );
        up
    }

    /// `PUT /api/v1/agent/facts`; panics unless the server took them.
    pub async fn put_facts(&self, api: &Api, facts: Value) {
        let (s, v) = api
            .call(
                Method::PUT,
                "/api/v1/agent/facts",
                Some(&self.credential),
                Some(facts),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
}

/// `host` enrolled, with a memcpy result of `gbs` GB/s for each figure of `history`, each
/// judged on arrival: what a node's verdict and baseline are made of.
pub async fn node_with_history(api: &Api, host: &str, history: &[f64]) {
    let token = api.enrollment_token(None).await;
    let agent = FakeAgent::enrolled_with(api, &token, host).await;
    for (i, gbs) in history.iter().enumerate() {
        api.ok(
            Method::POST,
            "/api/v1/runs",
            Some(&api.token),
            Some(json!({"kind": "memcpy", "nodes": [host]})),
        )
        .await;
        let lease = agent.next_job(api).await.expect("the memcpy job");
        let body = json!({"upload_key": format!("{host}-{i}"), "outcome": "succeeded",
            "rows": [{"size_bytes": 64 << 20, "op": "memcpy", "algbw_gbs": gbs, "wrong": 0}],
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
        agent
            .upload(api, lease["job_id"].as_str().unwrap(), body)
            .await;
    }
}
