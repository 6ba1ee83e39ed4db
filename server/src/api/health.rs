use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use crate::AppState;
use crate::error::ApiResult;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "alive")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness: Postgres answers.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, description = "ready"), (status = 503, description = "Postgres unreachable")))]
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match sqlx::query("SELECT 1").execute(&state.db).await {
        Ok(_) => (StatusCode::OK, "ready\n".to_string()),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("postgres: {err}\n"),
        ),
    }
}

/// Prometheus metrics: OpenMetrics when the Accept header asks for it, else the text
/// format 0.0.4.
#[utoipa::path(get, path = "/metrics", tag = "health", responses((status = 200, description = "OpenMetrics or Prometheus text format")))]
pub async fn metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let (content_type, body) = state.metrics.render(&state, &headers).await?;
    Ok(([(header::CONTENT_TYPE, content_type)], body))
}
