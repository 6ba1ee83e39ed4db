//! The one HTTP client of the tests. Three ways to ask, for three kinds of test:
//! `call`/`get`/`post`/`raw` give the status and the body whatever they are (a test of the
//! API's answers); `ok` panics unless the answer is a success (setting up what a test then
//! checks); `try_ok` returns an error instead (a test that rides out faults it causes).
//! `fetch`, `send`, `run` and `results` are the admin's typed view under `/api/v1`, for
//! tests that poll.

use heddle_server::testing::TestServer;
use heddle_types::jobs::{JobResult, Run};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

pub struct Api {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub base: String,
    /// The admin's token, which `ok`, `try_ok` and the typed calls use.
    pub token: String,
    pub http: reqwest::Client,
}

impl Api {
    /// The server's admin, through the server's own client (which trusts its test CA).
    pub fn new(server: &TestServer) -> Api {
        Api {
            base: server.url.clone(),
            token: server.admin_token.clone(),
            http: server.client(),
        }
    }

    /// `token` at `base`: a server this process did not start (a child process, a
    /// container).
    pub fn at(base: &str, token: &str) -> Api {
        Api {
            base: base.into(),
            token: token.into(),
            http: reqwest::Client::new(),
        }
    }

    /// The same token and connections at another replica.
    pub fn on(&self, base: &str) -> Api {
        Api {
            base: base.into(),
            token: self.token.clone(),
            http: self.http.clone(),
        }
    }

    fn request(&self, method: Method, path: &str, token: Option<&str>) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// `METHOD path` as `token` (none: no credential) with a JSON body: the status and the
    /// body, as JSON when it is JSON and as a string otherwise.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.request(method, path, token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        answer(req).await
    }

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(token), Some(body)).await
    }

    /// Like [`call`](Self::call) with a body of any content type.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let req = self
            .request(method, path, token)
            .header("content-type", content_type)
            .body(body);
        answer(req).await
    }

    /// The body of a successful `METHOD path` as `token` (`Null` when it is not JSON);
    /// panics naming the path, status and body otherwise.
    pub async fn ok(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Value {
        let shown = format!("{method} {path}");
        let mut req = self.request(method, path, token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let (status, text) = exchange(req).await;
        assert!(status.is_success(), "{shown}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// The admin's `METHOD path`: the status and the body as text, or an error when no
    /// answer came (a server or database that is down is what such a test is about).
    pub async fn try_call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(StatusCode, String)> {
        let mut req = self.request(method, path, Some(&self.token));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await?;
        let status = resp.status();
        Ok((status, resp.text().await?))
    }

    /// The admin's `METHOD path`: the body of a success (`Null` when it is not JSON), or an
    /// error naming the path, status and body (a request that got no answer is an error
    /// too).
    pub async fn try_ok(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let shown = format!("{method} {path}");
        let (status, text) = self.try_call(method, path, body).await?;
        anyhow::ensure!(status.is_success(), "{shown}: {status}: {text}");
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The admin's `GET /api/v1{path}`, decoded; `None` unless it succeeded.
    pub async fn fetch<T: serde::de::DeserializeOwned>(&self, path: &str) -> Option<T> {
        let resp = self
            .request(Method::GET, &format!("/api/v1{path}"), Some(&self.token))
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    /// The status of the admin's bodiless `METHOD /api/v1{path}`.
    pub async fn send(&self, method: Method, path: &str) -> u16 {
        self.request(method, &format!("/api/v1{path}"), Some(&self.token))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    pub async fn run(&self, id: Uuid) -> Option<Run> {
        self.fetch(&format!("/runs/{id}")).await
    }

    pub async fn results(&self, id: Uuid) -> Vec<JobResult> {
        self.fetch(&format!("/runs/{id}/results"))
            .await
            .unwrap_or_default()
    }

    /// A new enrollment token, bound to `node` when given.
    pub async fn enrollment_token(&self, node: Option<&str>) -> String {
        let v = self
            .ok(
                Method::POST,
                "/api/v1/enrollment-tokens",
                Some(&self.token),
                Some(json!({"node": node})),
            )
            .await;
        v["token"].as_str().unwrap().to_string()
    }
}

async fn exchange(req: reqwest::RequestBuilder) -> (StatusCode, String) {
    let resp = req.send().await.expect("request");
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

async fn answer(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let (status, text) = exchange(req).await;
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}
