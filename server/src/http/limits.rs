//! Limits at the door, before a handler runs: a rate per credential, a cap on concurrent
//! long polls. Both are per replica and in memory (a limit, not shared state). Request
//! timeouts and body sizes are layers in `router.rs`; the JSON nesting cap is in `json.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

use crate::http::auth;
use crate::http::error::ApiError;

/// Who a request counts against: the SHA-256 of the credential it presents (agent
/// credential, API token, dashboard session), else the peer's address.
#[derive(Debug, Clone, Copy)]
pub struct CredentialKey;

impl KeyExtractor for CredentialKey {
    type Key = String;

    fn extract<T>(&self, req: &axum::http::Request<T>) -> Result<Self::Key, GovernorError> {
        if let Some(token) = auth::presented_token(req.headers()) {
            return Ok(auth::sha256_hex(token));
        }
        Ok(match req.extensions().get::<ConnectInfo<SocketAddr>>() {
            Some(ConnectInfo(addr)) => format!("ip:{}", addr.ip()),
            None => "anonymous".to_string(),
        })
    }
}

/// The per-credential rate limit as a layer, or `None` when `per_s` is 0 (off). A task
/// forgets idle keys every minute, for as long as the layer lives.
pub fn rate_limit_layer(
    per_s: u32,
    burst: u32,
) -> Option<
    tower_governor::GovernorLayer<
        CredentialKey,
        governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
        axum::body::Body,
    >,
> {
    if per_s == 0 {
        return None;
    }
    let config = GovernorConfigBuilder::default()
        .key_extractor(CredentialKey)
        .period(Duration::from_secs_f64(1.0 / f64::from(per_s)))
        .burst_size(burst.max(1))
        .finish()?;
    let config = Arc::new(config);
    let weak = Arc::downgrade(&config);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(config) = weak.upgrade() else { break };
            config.limiter().retain_recent();
        }
    });
    Some(
        tower_governor::GovernorLayer::new(config).error_handler(|err| match err {
            GovernorError::TooManyRequests { wait_time, .. } => ApiError::RateLimited(
                wait_time,
                "too many requests with this credential; slow down and retry after the \
                 Retry-After seconds"
                    .into(),
            )
            .into_response(),
            other => ApiError::Internal(anyhow::anyhow!("rate limiter: {other}")).into_response(),
        }),
    )
}

/// At most `max` long polls (rendezvous waits, pre-flight waits) at once on this replica;
/// the next is answered at once with 503 and Retry-After, so its client tries another
/// replica or comes back, instead of holding a connection and a task here.
#[derive(Clone)]
pub struct LongPolls(Arc<Semaphore>);

impl LongPolls {
    pub fn new(max: usize) -> Self {
        LongPolls(Arc::new(Semaphore::new(max)))
    }
}

pub async fn long_poll_gate(
    axum::extract::State(polls): axum::extract::State<LongPolls>,
    req: Request,
    next: Next,
) -> Response {
    match polls.0.clone().try_acquire_owned() {
        Ok(permit) => {
            let response = next.run(req).await;
            drop(permit);
            response
        }
        Err(_) => ApiError::Busy(
            "this replica is serving as many long polls as it allows \
             (HEDDLE_MAX_LONG_POLLS); retry shortly or ask another replica"
                .into(),
        )
        .into_response(),
    }
}

/// How much of a request body is read before any handler, rejection or extractor sees it.
#[derive(Debug, Clone, Copy)]
pub struct BodyFirst {
    pub max_bytes: usize,
    pub timeout: Duration,
}

/// Reads a body of a declared length up to `max_bytes` before the request goes on, so that
/// an answer given without looking at the body (a refused credential or path, a 4xx from
/// an extractor before the body's) still leaves the connection clean: hyper drains an
/// unread body only if it already arrived, else closes the connection, and a client
/// that sent headers and body in two segments then finds its next request on that
/// keep-alive connection dropped without an answer. Larger bodies (uploads) and bodies
/// of no declared length are left to their handlers. A body that does not arrive within
/// the request timeout gets a 408.
pub async fn read_body_first(
    axum::extract::State(limits): axum::extract::State<BodyFirst>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let Some(len) = declared.filter(|&n| n > 0 && n <= limits.max_bytes) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let read = tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, len));
    let bytes = match read.await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(err)) => {
            return ApiError::BadRequest(format!("reading the request body failed: {err}"))
                .into_response();
        }
        Err(_) => {
            return ApiError::Timeout(
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s (HEDDLE_REQUEST_TIMEOUT_S); send it again",
                    limits.timeout.as_secs()
                ),
            )
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}
