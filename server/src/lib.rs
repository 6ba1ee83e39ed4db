//! The Heddle control-plane server.
//!
//! Stateless: every replica keeps its state in Postgres, so several may share one database.
//! `router.rs` lists every route; handlers live in `api/`, SQL next to the types it returns.

pub mod api;
pub mod auth;
pub mod config;
pub mod credentials;
pub mod dashboard;
pub mod db;
pub mod error;
pub mod health;
pub mod history;
pub mod job_env;
pub mod jobs;
pub mod json;
pub mod k8s_admission;
pub mod leases;
pub mod limits;
pub mod liveness;
pub mod metrics;
pub mod observed;
pub mod plugins;
pub mod plugins_bundled;
pub mod recommendations;
pub mod router;
pub mod runs_env;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tls;

use std::sync::Arc;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;

pub use config::Config;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub db: sqlx::PgPool,
    pub config: Arc<Config>,
    pub metrics: Arc<metrics::Metrics>,
    pub plugins: Arc<plugins::PluginRuntime>,
    /// This replica's view of whether Postgres answers (for `/readyz`).
    pub db_reach: Arc<db::reachability::Reachability>,
    /// Heartbeats received since the last flush (`liveness.rs`).
    pub liveness: Arc<liveness::Liveness>,
    /// Agent credentials Postgres accepted, trusted while revocations are read in time.
    pub credentials: Arc<credentials::CredentialCache>,
    /// The facts hash each node's agent last reported, as stored (`api/agent.rs`).
    pub facts_seen: Arc<liveness::FactsSeen>,
    /// Each node's job environment version, as this replica last read it (`job_env.rs`).
    pub job_env_seen: Arc<job_env::JobEnvSeen>,
    /// Enrollment token uses taken in a block and not yet handed out (`api/token_uses.rs`).
    pub token_uses: Arc<api::token_uses::TokenUses>,
}

/// Connects to Postgres, applies migrations (serialised across replicas by sqlx's advisory
/// lock) and makes sure the history tables have their months ahead (`history::partitions`).
pub async fn connect(config: &Config) -> anyhow::Result<sqlx::PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(config.db_max_connections)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(&config.database_url)
        .await
        .with_context(|| "connecting to Postgres (HEDDLE_DATABASE_URL)")?;
    sqlx::migrate!("../migrations")
        .run(&pool)
        .await
        .context("applying migrations")?;
    history::partitions::ensure(&pool, config.history_keep())
        .await
        .context("creating the history tables' monthly partitions")?;
    Ok(pool)
}

impl AppState {
    pub async fn new(config: Config) -> anyhow::Result<Self> {
        let db = connect(&config).await?;
        let plugins = Arc::new(plugins::PluginRuntime::from_config(&config)?);
        Ok(AppState {
            db,
            credentials: Arc::new(credentials::CredentialCache::new(config.revocation_delay())),
            facts_seen: Arc::default(),
            job_env_seen: Arc::default(),
            token_uses: Arc::default(),
            config: Arc::new(config),
            metrics: Arc::new(metrics::Metrics::new()),
            plugins,
            db_reach: Arc::default(),
            liveness: Arc::default(),
        })
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then drains in-flight requests:
/// HTTPS when the configuration names a certificate (reloaded while serving), plain HTTP
/// otherwise. Also runs this replica's lease reaper, heartbeat flusher, plugin reconciler
/// and history maintenance for as long as it serves, and flushes heartbeats once more when it stops.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    // Before anything else, so a wrong path fails the start at once.
    let tls = tls::CertFiles::from_config(&state.config)?;
    if let Some(token) =
        auth::bootstrap_admin(&state.db, state.config.admin_token.as_deref()).await?
    {
        // Printed once, on the first start against an empty database.
        println!("heddle-server: created admin token (shown once): {token}");
        tracing::warn!("created the first admin token; it was printed on stdout and is not logged");
    }
    let reaper = tokio::spawn(leases::run_reaper(state.clone()));
    let (stop_flusher, flusher_stop) = tokio::sync::oneshot::channel();
    let flusher = tokio::spawn(liveness::run_flusher(state.clone(), flusher_stop));
    let reconciler = tokio::spawn(plugins::run_reconciler(state.clone()));
    let revocations = tokio::spawn(credentials::run_feed(state.clone()));
    let (stop_returns, returns_stop) = tokio::sync::oneshot::channel();
    let returns = tokio::spawn(api::token_uses::run_returns(state.clone(), returns_stop));
    let investigator = tokio::spawn(health::investigate::run_loop(state.clone()));
    let history = tokio::spawn(history::retention::run_loop(state.clone()));
    let reload_interval = state.config.tls_reload_interval();
    let app = router::app(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let result = match tls {
        Some(files) => {
            use axum::serve::ListenerExt;
            let acceptor = files.acceptor()?;
            let pin = files.pin().map(|p| p.to_string()).unwrap_or_default();
            tracing::info!(%addr, %pin, "serving HTTPS (clients may pin this key with --pin-sha256)");
            let watcher = tokio::spawn(tls::watch(files, reload_interval));
            // `tap_io` only so that axum's connect-info impl (for any listener) applies.
            let listener = tls::TlsListener::new(listener, acceptor).tap_io(|_| {});
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await;
            watcher.abort();
            served
        }
        None => {
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    %addr,
                    "serving plain HTTP on a non-loopback address: tokens and credentials cross \
                     the network unencrypted. Give --tls-cert and --tls-key, or put a \
                     TLS-terminating proxy in front (docs/security.md)"
                );
            }
            tracing::info!(%addr, "serving");
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    };
    reaper.abort();
    reconciler.abort();
    revocations.abort();
    investigator.abort();
    history.abort();
    // After the last request: what this replica heard from its agents reaches the database.
    let _ = stop_flusher.send(());
    // And the enrollment token uses it held go back to their tokens.
    let _ = stop_returns.send(());
    if let Err(err) = returns.await {
        tracing::warn!(error = %err, "giving back enrollment token uses ended abnormally");
    }
    if let Err(err) = flusher.await {
        tracing::warn!(error = %err, "the heartbeat flusher ended abnormally");
    }
    result.context("serving HTTP")
}
