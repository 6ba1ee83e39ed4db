//! Every HTTP route of the server, in one place. The OpenAPI document is generated from
//! the handlers' `#[utoipa::path]` annotations as they are registered here.

use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{
    agent, decommission, enroll, expectations, fabric, investigations, node_list, nodes, observed,
    plugins, probes, regressions, rendezvous, run_kinds, runs, sweeps, tokens, verdicts,
};
use crate::dashboard;
use crate::http::error::ApiError;
use crate::http::limits::{self, LongPolls};
use crate::http::metrics;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Heddle API", description = "Control plane for GPU cluster networks: inventory, tests, plugins."),
    modifiers(&SecuritySchemes),
    tags(
        (name = "nodes", description = "Inventory, facts, recommendations and the env export"),
        (name = "runs", description = "Tests and tuning sweeps run by agents"),
        (name = "plugins", description = "WebAssembly plugins"),
        (name = "tokens", description = "API tokens and the audit log"),
        (name = "agents", description = "Agent enrollment and revocation"),
        (name = "agent", description = "The protocol agents speak (agent credentials)"),
        (name = "probes", description = "The server's own probes: alive and ready (no auth), metrics (HEDDLE_METRICS_TOKEN when set)"),
        (name = "investigations", description = "Which node is bad? Pairwise runs, node and GPU matrices, culprits"),
        (name = "verdicts", description = "Is this normal? Verdicts, expectations, node and fleet health, observed workloads, pre-flight"),
        (name = "fabric", description = "The site's fabric: nodes, NICs, switches and links, imported from a topology file"),
    )
)]
struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer =
            || SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build());
        components.add_security_scheme("bearer", bearer());
        components.add_security_scheme("agent", bearer());
    }
}

/// A request timeout as a layer: a request still running after `$after` is dropped and
/// answered 408 `request_timeout` (a body trickling in counts too). `$knob` names the
/// setting in the answer.
macro_rules! timeout {
    ($after:expr, $knob:literal) => {{
        let after: Duration = $after;
        tower::ServiceBuilder::new()
            .layer(HandleErrorLayer::new(
                move |_: tower::BoxError| async move {
                    ApiError::Timeout(
                        "request_timeout",
                        format!(
                            "the request did not complete within {} s ({}); send it again",
                            after.as_secs(),
                            $knob
                        ),
                    )
                },
            ))
            .layer(tower::timeout::TimeoutLayer::new(after))
    }};
}

fn api(state: &AppState) -> OpenApiRouter<AppState> {
    let config = &state.config;
    let uploads = OpenApiRouter::new()
        .merge(
            OpenApiRouter::new()
                .routes(routes!(agent::upload_result))
                .layer(DefaultBodyLimit::max(config.max_result_bytes)),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(observed::upload_observations))
                .layer(DefaultBodyLimit::max(config.max_result_bytes)),
        )
        .merge(
            OpenApiRouter::new()
                .routes(routes!(plugins::upload))
                .layer(DefaultBodyLimit::max(config.max_plugin_bytes)),
        )
        .merge(
            // A whole site's topology file: read and checked before it replaces the stored one.
            OpenApiRouter::new()
                .routes(routes!(fabric::get_fabric, fabric::import_fabric))
                .layer(DefaultBodyLimit::max(config.max_fabric_bytes)),
        )
        .layer(timeout!(config.upload_timeout(), "HEDDLE_UPLOAD_TIMEOUT_S"));
    let long_polls = OpenApiRouter::new()
        .routes(routes!(rendezvous::rendezvous_get))
        .routes(routes!(verdicts::preflight))
        .route_layer(axum::middleware::from_fn_with_state(
            LongPolls::new(config.max_long_polls),
            limits::long_poll_gate,
        ))
        .layer(timeout!(
            config.long_poll_timeout(),
            "HEDDLE_LONG_POLL_TIMEOUT_S"
        ));
    let metrics_route = OpenApiRouter::new()
        .routes(routes!(probes::metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::require_token,
        ));
    // The first names of /workloads: the same answers, with Deprecation and Link headers.
    #[allow(deprecated)]
    let workload_aliases = OpenApiRouter::new()
        .routes(routes!(observed::list_jobs))
        .routes(routes!(observed::get_job))
        .route_layer(axum::middleware::from_fn(observed::deprecated_alias));
    let short = OpenApiRouter::new()
        // Probes: no auth; metrics: HEDDLE_METRICS_TOKEN when set.
        .routes(routes!(probes::healthz))
        .routes(routes!(probes::readyz))
        .merge(metrics_route)
        // Tokens, agents, audit.
        .routes(routes!(tokens::whoami))
        .routes(routes!(tokens::create_session, tokens::delete_session))
        .routes(routes!(tokens::create_token, tokens::list_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(
            tokens::create_enrollment_token,
            tokens::list_enrollment_tokens
        ))
        .routes(routes!(tokens::revoke_enrollment_token))
        .routes(routes!(tokens::list_agents))
        .routes(routes!(tokens::revoke_agent))
        .routes(routes!(enroll::list_pending))
        .routes(routes!(enroll::approve))
        .routes(routes!(enroll::reject))
        .routes(routes!(tokens::audit_log))
        // Inventory.
        .routes(routes!(node_list::list_nodes))
        .routes(routes!(node_list::node_counts))
        .routes(routes!(
            nodes::get_node,
            nodes::update_node,
            decommission::delete_node
        ))
        .routes(routes!(nodes::facts_history))
        .routes(routes!(nodes::node_env))
        .routes(routes!(nodes::node_job_env))
        .routes(routes!(nodes::node_env_explain))
        .routes(routes!(nodes::put_recommendations))
        .routes(routes!(nodes::create_site, nodes::list_sites))
        .routes(routes!(nodes::create_profile, nodes::list_profiles))
        .routes(routes!(nodes::delete_profile))
        // Runs.
        .routes(routes!(runs::create_run, runs::list_runs))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::cancel_run))
        .routes(routes!(runs::run_results))
        .routes(routes!(run_kinds::list_run_kinds))
        .routes(routes!(sweeps::sweep_table))
        .routes(routes!(sweeps::keep_winner))
        // Investigations.
        .routes(routes!(
            investigations::create_investigation,
            investigations::list_investigations
        ))
        .routes(routes!(investigations::get_investigation))
        .routes(routes!(investigations::p2p_matrix))
        .routes(routes!(
            fabric::create_fabric_investigation,
            fabric::list_fabric_investigations
        ))
        .routes(routes!(fabric::get_fabric_investigation))
        // Verdicts and expectations (pre-flight, a long poll, is below).
        .routes(routes!(expectations::create, expectations::list))
        .routes(routes!(expectations::delete))
        .routes(routes!(verdicts::node_health))
        .routes(routes!(verdicts::fleet_health))
        // Observed workloads (the agents' uploads are below), and their deprecated first names.
        .routes(routes!(observed::list_workloads))
        .routes(routes!(observed::get_workload))
        .merge(workload_aliases)
        // Regressions (health::regress).
        .routes(routes!(regressions::list))
        .routes(routes!(regressions::series))
        // Plugins (uploads are below).
        .routes(routes!(plugins::list))
        .routes(routes!(plugins::versions))
        .routes(routes!(plugins::download))
        .routes(routes!(plugins::enable))
        .routes(routes!(plugins::disable))
        .routes(routes!(plugins::dry_run))
        .routes(routes!(plugins::node_outcomes))
        // Agent protocol (result uploads and rendezvous waits are below).
        .routes(routes!(enroll::enroll))
        .routes(routes!(agent::heartbeat))
        .routes(routes!(agent::job_env))
        .routes(routes!(agent::put_facts))
        .routes(routes!(agent::claim))
        .routes(routes!(agent::renew))
        .routes(routes!(rendezvous::rendezvous_put))
        .layer(timeout!(
            config.request_timeout(),
            "HEDDLE_REQUEST_TIMEOUT_S"
        ));
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(short)
        .merge(uploads)
        .merge(long_polls)
}

/// The OpenAPI document, as served at `/api/v1/openapi.json`.
pub fn openapi(state: &AppState) -> utoipa::openapi::OpenApi {
    api(state).split_for_parts().1
}

pub fn app(state: AppState) -> Router {
    let (api_router, doc) = api(&state).split_for_parts();
    let doc_json = std::sync::Arc::new(
        doc.to_pretty_json()
            .expect("the OpenAPI document serialises"),
    );
    let api_router = api_router
        .route(
            "/api/v1/openapi.json",
            axum::routing::get(move || {
                let doc = doc_json.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        (*doc).clone(),
                    )
                }
            }),
        )
        .route(
            "/api/{*rest}",
            axum::routing::any(|| async {
                ApiError::NotFound("no such API route".into()).into_response()
            }),
        );
    let dashboard = dashboard::routes(&state).layer(timeout!(
        state.config.request_timeout(),
        "HEDDLE_REQUEST_TIMEOUT_S"
    ));
    // The Kubernetes admission webhook, outside /api: the API server calls it (no token).
    let k8s = crate::k8s_admission::routes().layer(timeout!(
        state.config.request_timeout(),
        "HEDDLE_REQUEST_TIMEOUT_S"
    ));
    let mut app = api_router.merge(dashboard).merge(k8s);
    if let Some(rate_limit) =
        limits::rate_limit_layer(state.config.rate_limit_per_s, state.config.rate_limit_burst)
    {
        app = app.layer(rate_limit);
    }
    app.layer(axum::middleware::from_fn_with_state(
        state.clone(),
        metrics::track,
    ))
    .layer(axum::middleware::from_fn(refuse_nul_in_path))
    .layer(axum::middleware::from_fn_with_state(
        limits::BodyFirst {
            max_bytes: state.config.max_body_bytes,
            timeout: state.config.request_timeout(),
        },
        limits::read_body_first,
    ))
    .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
    .layer(TraceLayer::new_for_http())
    .layer(CatchPanicLayer::custom(|_| {
        ApiError::Internal(anyhow::anyhow!("handler panicked")).into_response()
    }))
    .with_state(state)
}

/// No name, id or version contains a NUL byte, and Postgres cannot store one: refuse it up
/// front with a 400 rather than let it reach a query.
async fn refuse_nul_in_path(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = req.uri().path();
    if path.contains("%00") || path.contains('\0') {
        return ApiError::BadRequest("the path contains a NUL byte".into()).into_response();
    }
    next.run(req).await
}
