//! The server's own probes, for load balancers, orchestrators and Prometheus: `/healthz`
//! (the process answers), `/readyz` (Postgres answers) and `/metrics`. Not to be confused
//! with a node's health (`verdicts.rs`, `health/`) or an agent's liveness.

use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{SecondsFormat, Utc};

use crate::http::error::{ApiResult, db_unreachable};
use crate::state::AppState;

/// The process answers (a liveness probe, in Kubernetes' terms).
#[utoipa::path(get, path = "/healthz", tag = "probes", responses((status = 200, description = "alive")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// How long each `/readyz` probe waits for Postgres.
const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Readiness: Postgres answers. When it does not, 503 with `Retry-After` and why: since
/// when this replica has seen it unreachable and the last error.
#[utoipa::path(get, path = "/readyz", tag = "probes",
    responses((status = 200, description = "ready"), (status = 503, description = "Postgres unreachable: since when, and the last error")))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    let probe = tokio::time::timeout(READY_PROBE_TIMEOUT, crate::db::ping(&state.db)).await;
    match probe {
        Ok(Ok(_)) => {
            state.db_reach.reached();
            return (StatusCode::OK, "ready\n").into_response();
        }
        Ok(Err(err)) if !db_unreachable(&err) => {
            // Postgres answered, with an error: reachable, but this replica cannot work.
            return not_ready(format!("database answered with an error: {err}"));
        }
        // The pool only says it timed out; a connection of our own says why.
        _ => match why_unreachable(&state.db).await {
            Some(why) => state.db_reach.unreachable(why),
            None => state.db_reach.unreachable(format!(
                "no connection from the pool within {READY_PROBE_TIMEOUT:?} (Postgres \
                 accepts new ones: every pooled connection is busy)"
            )),
        },
    }
    let (since, last_error) = state
        .db_reach
        .outage()
        .map(|o| (o.since, o.last_error))
        .unwrap_or_else(|| (Utc::now(), "unknown".into()));
    let secs = (Utc::now() - since).num_seconds().max(0);
    not_ready(format!(
        "database unreachable since {} ({secs} s); last error: {last_error}",
        since.to_rfc3339_opts(SecondsFormat::Secs, true)
    ))
}

/// Why a fresh connection to the pool's database fails; `None` when it succeeds.
async fn why_unreachable(db: &sqlx::PgPool) -> Option<String> {
    use sqlx::Connection;
    let options = db.connect_options();
    match tokio::time::timeout(
        READY_PROBE_TIMEOUT,
        sqlx::PgConnection::connect_with(&options),
    )
    .await
    {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            None
        }
        Ok(Err(err)) => Some(err.to_string()),
        Err(_) => Some(format!(
            "connecting took longer than {READY_PROBE_TIMEOUT:?}"
        )),
    }
}

fn not_ready(why: String) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        format!("{why}\n"),
    )
        .into_response()
}

/// Prometheus metrics: OpenMetrics when the Accept header asks for it, else the text
/// format 0.0.4.
#[utoipa::path(get, path = "/metrics", tag = "probes", responses((status = 200, description = "OpenMetrics or Prometheus text format")))]
pub async fn metrics(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> ApiResult<impl IntoResponse> {
    let (content_type, body) = state
        .metrics
        .render(&state.db, state.config.heartbeat_interval(), &headers)
        .await?;
    Ok(([(header::CONTENT_TYPE, content_type)], body))
}
