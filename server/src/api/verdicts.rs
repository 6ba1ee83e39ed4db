//! "Is this normal?": node and fleet health from stored verdicts, and pre-flight for job
//! launchers. The rules live in `health/`; docs/health.md explains them.

use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use heddle_types::NEXT_CURSOR_HEADER;
use heddle_types::auth::Role;
use heddle_types::health::{
    FleetHealth, NodeHealth, PreflightRequest, PreflightResponse, Severity, Verdict,
};

use crate::api::page::{self, Page};
use crate::db;
use crate::health::{checks, preflight, store};
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path, Query};
use crate::state::AppState;

/// The latest verdict of every test on a node.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/health", tag = "verdicts", security(("bearer" = [])),
    params(("node" = String, Path, description = "node id or hostname")),
    responses((status = 200, body = NodeHealth), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn node_health(
    State(state): State<AppState>,
    caller: Caller,
    Path(node): Path<String>,
) -> ApiResult<Json<NodeHealth>> {
    caller.require(Role::Viewer)?;
    let node_id = db::resolve_node(&state.db, &node).await?;
    let hostname = crate::nodes::hostname(&state.db, node_id).await?;
    let tests = store::node_tests(&state.db, node_id).await?;
    let checks = checks::for_node(&state.db, node_id).await?;
    // Observed jobs that warn or fail count against the node (docs/health.md).
    let jobs = crate::health::observed::node_reasons(&state.db, node_id).await?;
    // So do open regressions, at the configured severity.
    let regressions = crate::health::regress::store::node_reasons(
        &state.db,
        node_id,
        state.config.regression_severity(),
    )
    .await?;
    // So does a job environment that leaves out a value the node's ranks would disagree on.
    let job_env = crate::job_env::health_reasons(&state.db, node_id).await?;
    // And a fabric investigation that blamed the node, its NIC, or a switch it hangs off.
    let fabric = crate::investigate::fabric::node_reasons(&state.db, &hostname).await?;
    let verdict = Verdict::combine(
        tests
            .iter()
            .map(|t| t.verdict)
            .chain(checks::verdicts(&checks))
            .chain(jobs.iter().map(|r| match r.severity {
                Severity::Fail => Verdict::Fail,
                _ => Verdict::Warn,
            }))
            // Regressions, the job environment and fabric blames count at their reasons'
            // severity.
            .chain(
                regressions
                    .iter()
                    .chain(&job_env)
                    .chain(&fabric)
                    .filter_map(|r| match r.severity {
                        Severity::Fail => Some(Verdict::Fail),
                        Severity::Warn => Some(Verdict::Warn),
                        Severity::Info => None,
                    }),
            ),
    );
    let mut reasons = checks::reasons(&checks);
    reasons.extend(jobs);
    reasons.extend(regressions);
    reasons.extend(job_env);
    reasons.extend(fabric);
    Ok(Json(NodeHealth {
        node_id,
        hostname,
        verdict,
        tests,
        reasons,
    }))
}

#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct FleetPage {
    /// Node lines per page (1 to 1000). Without it, every node's line in one answer.
    limit: Option<i64>,
    /// Where the next page starts: the `x-next-cursor` of the previous page.
    cursor: Option<String>,
}

/// Every node's combined verdict, worst first, with counts of the whole fleet. With `limit`,
/// the lines come a page at a time (the counts are always the fleet's).
#[utoipa::path(get, path = "/api/v1/health", tag = "verdicts", security(("bearer" = [])), params(FleetPage),
    responses((status = 200, body = FleetHealth, headers(("x-next-cursor" = String,
            description = "present when `limit` cut the lines short: pass it as `cursor` for the next page"))),
        (status = 400, body = heddle_types::ErrorBody)))]
pub async fn fleet_health(
    State(state): State<AppState>,
    caller: Caller,
    Query(q): Query<FleetPage>,
) -> ApiResult<Response> {
    caller.require(Role::Viewer)?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| {
            let key = page::decode(c)?;
            key.split_once(':')
                .and_then(|(rank, host)| Some((rank.parse::<u8>().ok()?, host.to_string())))
                .ok_or_else(|| {
                    ApiError::BadRequest(
                        "cursor is not one this server handed out (x-next-cursor)".into(),
                    )
                })
        })
        .transpose()?;
    let mut fleet = store::fleet(&state.db, state.config.regression_severity()).await?;
    if let Some(after) = &after {
        fleet.nodes.retain(|l| store::fleet_key(l) > *after);
    }
    let mut next = None;
    if let Some(limit) = q.limit {
        let limit = super::limit(Some(limit), limit);
        let page = Page::of(std::mem::take(&mut fleet.nodes), limit, |l| {
            let (rank, host) = store::fleet_key(l);
            format!("{rank}:{host}")
        });
        fleet.nodes = page.rows;
        next = page.next;
    }
    let mut response = Json(fleet).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        response.headers_mut().insert(NEXT_CURSOR_HEADER, next);
    }
    Ok(response)
}

/// A verdict for a set of nodes before a job starts on them: from verdicts younger than
/// `max_age_s`, else from a quick check run on the stale nodes (operator tokens only),
/// waited for up to `wait_s`. The answer is 200 whatever the verdict; `unknown` means it
/// could not be decided in time.
#[utoipa::path(post, path = "/api/v1/preflight", tag = "verdicts", security(("bearer" = [])), request_body = PreflightRequest,
    responses((status = 200, body = PreflightResponse), (status = 404, body = heddle_types::ErrorBody), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn preflight(
    State(state): State<AppState>,
    caller: Caller,
    Json(req): Json<PreflightRequest>,
) -> ApiResult<Json<PreflightResponse>> {
    caller.require(Role::Viewer)?;
    if req.nodes.is_empty() || req.nodes.len() > crate::jobs::MAX_RUN_NODES {
        return Err(ApiError::Unprocessable(format!(
            "nodes must list 1 to {} nodes",
            crate::jobs::MAX_RUN_NODES
        )));
    }
    let max_age_s = req.max_age_s.unwrap_or(preflight::DEFAULT_MAX_AGE_S);
    if max_age_s == 0 || max_age_s > 366 * 86_400 {
        return Err(ApiError::Unprocessable(
            "max_age_s must be between 1 and 31622400 (a year)".into(),
        ));
    }
    let wait_s = req.wait_s.unwrap_or(preflight::DEFAULT_WAIT_S);
    if wait_s > preflight::MAX_WAIT_S {
        return Err(ApiError::Unprocessable(format!(
            "wait_s must be at most {}",
            preflight::MAX_WAIT_S
        )));
    }
    let mut nodes = Vec::with_capacity(req.nodes.len());
    for key in &req.nodes {
        let node_id = db::resolve_node(&state.db, key).await?;
        if nodes
            .iter()
            .any(|a: &preflight::Asked| a.node_id == node_id)
        {
            return Err(ApiError::Unprocessable(format!(
                "node {key:?} is listed twice"
            )));
        }
        nodes.push(preflight::Asked {
            key: key.clone(),
            node_id,
        });
    }
    let request = preflight::Request {
        nodes,
        check: req.check.unwrap_or_default(),
        max_age: Duration::from_secs(u64::from(max_age_s)),
        wait: Duration::from_secs(u64::from(wait_s)),
        operator: caller
            .require(Role::Operator)
            .is_ok()
            .then(|| caller.actor()),
    };
    let answer = preflight::preflight(&state.db, request).await?;
    tracing::info!(nodes = answer.nodes.len(), check = answer.check.as_str(), verdict = %answer.verdict, "preflight");
    Ok(Json(answer))
}
