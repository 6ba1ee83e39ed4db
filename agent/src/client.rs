//! HTTP client of the agent protocol (`/api/v1/agent/...`), with fail-over between server
//! replicas.
//!
//! Every call tries the server that answered last, then the others in order. A transport
//! error or a 5xx moves on to the next replica; any other answer is the server's word and
//! is returned. The client itself never sleeps: backoff belongs to the caller, who knows
//! whether the call is worth repeating.

use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use heddle_types::ErrorBody;
use heddle_types::agent::{
    EnrollPending, EnrollRequest, EnrollResponse, FactsAccepted, HeartbeatRequest,
    HeartbeatResponse, JobLease, LeaseRenew, LeaseRenewed, RendezvousBlob, UploadAccepted,
};
use heddle_types::jobs::ResultUpload;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

const API_PREFIX: &str = "/api/v1";
use heddle_types::FACTS_SHA_HEADER;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound for one control request (heartbeat, claim, renew...). Short, so a replica
/// that accepts connections but hangs is left for the next one before a lease lapses;
/// rendezvous waits add their own timeout to it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Result uploads may carry many rows (the server takes up to 16 MiB).
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No replica could be reached (connection refused, timeout, reset...). Retry later.
    #[error("no server reachable ({tried} tried): {last}")]
    Unreachable { tried: usize, last: String },
    /// Every replica reached answered 5xx (503 while the server's database is down).
    /// Retry later, not before `retry_after` when the server named it.
    #[error("server unavailable: {status} {message}")]
    Unavailable {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The credential (or enrollment token) was refused: the agent was revoked or the
    /// token is wrong. Retrying cannot help.
    #[error("unauthorized: {message}")]
    Unauthorized { message: String },
    /// Any other non-success answer, e.g. 409 or 404.
    #[error("server answered {status} {error}: {message}")]
    Rejected {
        status: u16,
        error: String,
        message: String,
    },
    #[error("unexpected response body for {what}: {detail}")]
    Decode { what: String, detail: String },
    #[error("invalid server URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// `--ca-file` or `--pin-sha256` cannot be used.
    #[error("TLS settings: {0}")]
    Tls(#[from] heddle_tls::TlsError),
    #[error("invalid rendezvous name {0:?}: use letters, digits, '.', '_' or '-'")]
    BadName(String),
}

impl ClientError {
    /// Worth repeating after a pause: the network or the server may come back.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::Unavailable { .. } => true,
            ClientError::Rejected { status, .. } => *status == 408 || *status == 429,
            _ => false,
        }
    }

    /// How long the server asked to wait (`Retry-After` on a 503 or 429).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Unavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Unavailable { status, .. } | ClientError::Rejected { status, .. } => {
                Some(*status)
            }
            ClientError::Unauthorized { .. } => Some(401),
            _ => None,
        }
    }
}

/// The answer to an enrollment.
#[derive(Debug, Clone)]
pub enum EnrollOutcome {
    /// 201: the agent's credential.
    Enrolled(EnrollResponse),
    /// 202: the host name has a live agent; an admin must approve. Ask again with the ticket.
    Pending(EnrollPending),
}

impl EnrollOutcome {
    /// The credential, if enrollment did not wait for approval.
    pub fn enrolled(self) -> Option<EnrollResponse> {
        match self {
            EnrollOutcome::Enrolled(r) => Some(r),
            EnrollOutcome::Pending(_) => None,
        }
    }
}

/// The answer to a lease renewal.
#[derive(Debug, Clone)]
pub enum RenewOutcome {
    Renewed(LeaseRenewed),
    /// 409: the job was requeued or handed to another agent; stop working on it.
    LeaseLost(String),
}

/// The answer to a result upload. Every variant is definitive: the spool entry can go.
#[derive(Debug, Clone)]
pub enum UploadOutcome {
    /// 201 (`created: true`) or 200 (`created: false`, this key was stored before).
    Stored(UploadAccepted),
    /// 409: the job already holds a different result.
    Conflict(String),
    /// 404: the server does not know the job.
    UnknownJob(String),
}

pub struct Client {
    http: reqwest::Client,
    tls: heddle_tls::ClientTls,
    request_timeout: Duration,
    servers: Vec<String>,
    current: AtomicUsize,
    credential: RwLock<Option<String>>,
}

impl Client {
    /// `servers` are base URLs such as `http://heddle-1:8080`; a trailing `/` is ignored.
    /// `https://` servers are checked against the system's CA certificates.
    pub fn new(servers: &[String]) -> Result<Client, ClientError> {
        Client::with_tls(servers, heddle_tls::ClientTls::default())
    }

    /// Like `new`, with a private CA and pins for `https://` servers (`--ca-file`,
    /// `--pin-sha256`).
    pub fn with_tls(servers: &[String], tls: heddle_tls::ClientTls) -> Result<Client, ClientError> {
        let mut clean = Vec::with_capacity(servers.len());
        for url in servers {
            let trimmed = url.trim().trim_end_matches('/');
            if trimmed.is_empty() {
                continue;
            }
            let parsed = reqwest::Url::parse(trimmed).map_err(|e| ClientError::BadUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ClientError::BadUrl {
                    url: url.clone(),
                    reason: "scheme must be http or https".into(),
                });
            }
            clean.push(trimmed.to_string());
        }
        if clean.is_empty() {
            return Err(ClientError::BadUrl {
                url: String::new(),
                reason: "no server URL given".into(),
            });
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            // An agent is long-lived: keep at most one idle connection per replica.
            .pool_max_idle_per_host(1)
            .user_agent(concat!("heddle-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(config) = tls.for_urls(clean.iter().map(String::as_str))? {
            builder = builder.use_preconfigured_tls(config);
        } else {
            // Plain HTTP only: no need to read the system's CA certificates.
            builder = builder.tls_built_in_root_certs(false);
        }
        let http = builder.build().map_err(|e| ClientError::BadUrl {
            url: clean.join(","),
            reason: e.to_string(),
        })?;
        Ok(Client {
            http,
            tls,
            request_timeout: REQUEST_TIMEOUT,
            servers: clean,
            current: AtomicUsize::new(0),
            credential: RwLock::new(None),
        })
    }

    /// Replaces the 10 s limit on control requests (uploads and rendezvous waits get more).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Client {
        self.request_timeout = timeout;
        self
    }

    /// The replicas this client talks to, in order.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// What this client trusts besides the system's CA certificates.
    pub fn tls(&self) -> &heddle_tls::ClientTls {
        &self.tls
    }

    /// The agent's bearer credential, once enrolled.
    pub fn credential(&self) -> Option<String> {
        self.credential.read().expect("credential lock").clone()
    }

    pub fn set_credential(&self, credential: String) {
        *self.credential.write().expect("credential lock") = Some(credential);
    }

    /// The replica that answered last.
    pub fn current_server(&self) -> &str {
        &self.servers[self.current.load(Ordering::Relaxed) % self.servers.len()]
    }

    pub async fn enroll(&self, req: &EnrollRequest) -> Result<EnrollOutcome, ClientError> {
        let resp = self
            .send(Method::POST, "/agent/enroll", Some(req), None, false)
            .await?;
        if resp.status() == StatusCode::ACCEPTED {
            return expect_json(resp, "enroll", &[StatusCode::ACCEPTED])
                .await
                .map(EnrollOutcome::Pending);
        }
        expect_json(resp, "enroll", &[StatusCode::CREATED, StatusCode::OK])
            .await
            .map(EnrollOutcome::Enrolled)
    }

    pub async fn heartbeat(
        &self,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, ClientError> {
        let resp = self
            .send(Method::POST, "/agent/heartbeat", Some(req), None, true)
            .await?;
        expect_json(resp, "heartbeat", &[StatusCode::OK]).await
    }

    /// The node's job environment, for the node env file.
    pub async fn job_env(&self) -> Result<heddle_types::agent::NodeJobEnv, ClientError> {
        let resp = self
            .send::<()>(Method::GET, "/agent/env", None, None, true)
            .await?;
        expect_json(resp, "job environment", &[StatusCode::OK]).await
    }

    /// `sha256` is the agent's hash of `facts`, the one it reports in heartbeats; sending
    /// it keeps both sides comparing the same hash.
    pub async fn put_facts(
        &self,
        facts: &impl Serialize,
        sha256: &str,
    ) -> Result<FactsAccepted, ClientError> {
        let resp = self
            .send_with(Method::PUT, "/agent/facts", Some(facts), None, true, |b| {
                b.header(FACTS_SHA_HEADER, sha256)
            })
            .await?;
        expect_json(resp, "facts", &[StatusCode::OK, StatusCode::CREATED]).await
    }

    /// `None` when nothing is queued for this node (204).
    pub async fn claim(&self) -> Result<Option<JobLease>, ClientError> {
        let resp = self
            .send::<()>(Method::POST, "/agent/jobs/claim", None, None, true)
            .await?;
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        expect_json(resp, "claim", &[StatusCode::OK])
            .await
            .map(Some)
    }

    /// Renews a lease. `per_replica` bounds each replica's answer (default: the request
    /// timeout): a renewal must reach a replica that answers before the lease lapses, so
    /// one that hangs (its own database connection cut) is left early for the next.
    pub async fn renew(
        &self,
        job_id: Uuid,
        req: &LeaseRenew,
        per_replica: Option<Duration>,
    ) -> Result<RenewOutcome, ClientError> {
        let path = format!("/agent/jobs/{job_id}/renew");
        let resp = self
            .send(Method::POST, &path, Some(req), per_replica, true)
            .await?;
        if resp.status() == StatusCode::CONFLICT {
            return Ok(RenewOutcome::LeaseLost(error_message(resp).await.1));
        }
        expect_json(resp, "renew", &[StatusCode::OK])
            .await
            .map(RenewOutcome::Renewed)
    }

    pub async fn upload_result(
        &self,
        job_id: Uuid,
        upload: &ResultUpload,
    ) -> Result<UploadOutcome, ClientError> {
        let path = format!("/agent/jobs/{job_id}/result");
        let resp = self
            .send_with(
                Method::POST,
                &path,
                Some(upload),
                Some(UPLOAD_TIMEOUT),
                true,
                |b| b.header(heddle_types::UPLOAD_KEY_HEADER, &upload.upload_key),
            )
            .await?;
        match resp.status() {
            StatusCode::CONFLICT => Ok(UploadOutcome::Conflict(error_message(resp).await.1)),
            StatusCode::NOT_FOUND => Ok(UploadOutcome::UnknownJob(error_message(resp).await.1)),
            _ => expect_json(
                resp,
                "result upload",
                &[StatusCode::CREATED, StatusCode::OK],
            )
            .await
            .map(UploadOutcome::Stored),
        }
    }

    /// Observed jobs' latest state; idempotent (the server keeps the highest `seq`).
    pub async fn upload_observations(
        &self,
        upload: &heddle_types::observed::ObservationUpload,
    ) -> Result<heddle_types::observed::ObservationsAccepted, ClientError> {
        let resp = self
            .send(
                Method::POST,
                "/agent/observations",
                Some(upload),
                Some(UPLOAD_TIMEOUT),
                true,
            )
            .await?;
        expect_json(resp, "observations", &[StatusCode::OK]).await
    }

    /// Publishes `blob` under `name` for the other ranks of `run_id`.
    pub async fn rendezvous_put(
        &self,
        run_id: Uuid,
        name: &str,
        blob: &[u8],
    ) -> Result<(), ClientError> {
        check_name(name)?;
        let path = format!("/agent/rendezvous/{run_id}/{name}");
        let body = RendezvousBlob {
            blob_b64: base64::engine::general_purpose::STANDARD.encode(blob),
        };
        let resp = self
            .send(Method::PUT, &path, Some(&body), None, true)
            .await?;
        if resp.status().is_success() {
            return Ok(());
        }
        Err(rejected(resp).await)
    }

    /// Waits up to `wait` for `name` to be published; `None` when the server gave up (408).
    pub async fn rendezvous_get(
        &self,
        run_id: Uuid,
        name: &str,
        wait: Duration,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        check_name(name)?;
        let path = format!(
            "/agent/rendezvous/{run_id}/{name}?timeout_ms={}",
            wait.as_millis()
        );
        let resp = self
            .send::<()>(
                Method::GET,
                &path,
                None,
                Some(self.request_timeout + wait),
                true,
            )
            .await?;
        if resp.status() == StatusCode::REQUEST_TIMEOUT {
            return Ok(None);
        }
        let blob: RendezvousBlob = expect_json(resp, "rendezvous", &[StatusCode::OK]).await?;
        base64::engine::general_purpose::STANDARD
            .decode(blob.blob_b64.as_bytes())
            .map(Some)
            .map_err(|e| ClientError::Decode {
                what: "rendezvous blob".into(),
                detail: e.to_string(),
            })
    }

    async fn send<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Option<Duration>,
        auth: bool,
    ) -> Result<reqwest::Response, ClientError> {
        self.send_with(method, path, body, timeout, auth, |b| b)
            .await
    }

    /// Sends to each replica in turn, starting with the last one that answered.
    async fn send_with<B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        timeout: Option<Duration>,
        auth: bool,
        extra: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let credential = if auth { self.credential() } else { None };
        let start = self.current.load(Ordering::Relaxed);
        let n = self.servers.len();
        let mut last: Option<ClientError> = None;
        for i in 0..n {
            let idx = (start + i) % n;
            let url = format!("{}{API_PREFIX}{path}", self.servers[idx]);
            let mut builder = self.http.request(method.clone(), &url);
            if let Some(body) = body {
                builder = builder.json(body);
            }
            if let Some(cred) = &credential {
                builder = builder.bearer_auth(cred);
            }
            builder = builder.timeout(timeout.unwrap_or(self.request_timeout));
            builder = extra(builder);
            match builder.send().await {
                Ok(resp) if resp.status().is_server_error() => {
                    let status = resp.status().as_u16();
                    let retry_after = retry_after(resp.headers());
                    let (_, message) = error_message(resp).await;
                    tracing::debug!(server = %self.servers[idx], status, %message, "replica answered with a server error");
                    // Of several replicas' hints the longest stands: all of them were asked.
                    let retry_after = match (&last, retry_after) {
                        (Some(prev), Some(r)) => Some(prev.retry_after().map_or(r, |p| p.max(r))),
                        (Some(prev), None) => prev.retry_after(),
                        (None, r) => r,
                    };
                    last = Some(ClientError::Unavailable {
                        status,
                        message,
                        retry_after,
                    });
                }
                Ok(resp) => {
                    if idx != start % n {
                        tracing::info!(server = %self.servers[idx], "switched to server replica");
                        self.current.store(idx, Ordering::Relaxed);
                    }
                    if resp.status() == StatusCode::UNAUTHORIZED {
                        return Err(ClientError::Unauthorized {
                            message: error_message(resp).await.1,
                        });
                    }
                    return Ok(resp);
                }
                Err(err) => {
                    tracing::debug!(server = %self.servers[idx], error = %err, "replica unreachable");
                    last = Some(ClientError::Unreachable {
                        tried: n,
                        last: format!("{}: {}", self.servers[idx], heddle_tls::describe(&err)),
                    });
                }
            }
        }
        Err(last.expect("at least one server is configured"))
    }
}

/// Longest `Retry-After` honoured; a larger (or hostile) value is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// `Retry-After` in its delay-seconds form, capped at [`MAX_RETRY_AFTER`]. The HTTP-date
/// form is not used by Heddle servers and is ignored.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER))
}

fn check_name(name: &str) -> Result<(), ClientError> {
    if heddle_types::names::RENDEZVOUS.allows(name) {
        Ok(())
    } else {
        Err(ClientError::BadName(name.into()))
    }
}

async fn expect_json<T: DeserializeOwned>(
    resp: reqwest::Response,
    what: &str,
    ok: &[StatusCode],
) -> Result<T, ClientError> {
    if !ok.contains(&resp.status()) {
        return Err(rejected(resp).await);
    }
    let bytes = resp.bytes().await.map_err(|e| ClientError::Unreachable {
        tried: 1,
        last: heddle_tls::describe(&e),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
        what: what.into(),
        detail: e.to_string(),
    })
}

async fn rejected(resp: reqwest::Response) -> ClientError {
    let status = resp.status().as_u16();
    let (error, message) = error_message(resp).await;
    ClientError::Rejected {
        status,
        error,
        message,
    }
}

/// `(error, message)` from an `ErrorBody`, or the raw text when the body is not one.
async fn error_message(resp: reqwest::Response) -> (String, String) {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => (body.error, body.message),
        Err(_) => (
            status.canonical_reason().unwrap_or("error").to_lowercase(),
            text.chars().take(512).collect(),
        ),
    }
}

#[cfg(test)]
mod tests;
