//! The request side of `/metrics`: every request counted and timed by its route
//! (`heddle_http_requests_total`, `heddle_http_request_duration_seconds`), and the bearer
//! token `/metrics` asks for when `HEDDLE_METRICS_TOKEN` is set. The registry is
//! `crate::metrics`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::AppState;

/// Guards `/metrics` when `HEDDLE_METRICS_TOKEN` is set: the scrape must present it as a
/// bearer token. (Per-node health series name every host and how it performs.)
pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    let Some(expected) = state.config.metrics_token.as_deref() else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    // Compared as hashes, so the time taken says nothing about how much of it matched.
    match presented {
        Some(t) if crate::http::auth::sha256_hex(t) == crate::http::auth::sha256_hex(expected) => {
            next.run(req).await
        }
        Some(_) => crate::http::error::ApiError::Unauthorized(
            "wrong metrics token; scrape with the bearer token set in HEDDLE_METRICS_TOKEN".into(),
        )
        .into_response(),
        None => crate::http::error::ApiError::Unauthorized(
            "/metrics needs `Authorization: Bearer <HEDDLE_METRICS_TOKEN>`".into(),
        )
        .into_response(),
    }
}

/// Middleware counting and timing every request by its route template (not the raw path,
/// which would give one series per node id).
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let start = Instant::now();
    let response = next.run(req).await;
    state
        .metrics
        .request_served(method, route, response.status().as_u16(), start.elapsed());
    response
}
