//! What every request handler and background worker is given: [`AppState`], built once at
//! start-up from the [`Config`].

use std::sync::Arc;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;

use crate::config::Config;
use crate::{credentials, db, job_env, liveness, metrics, plugins, token_uses};

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub db: sqlx::PgPool,
    /// Connections for the agents' hot requests only: heartbeats, claims, renewals and the
    /// credential look-ups in front of them (`HEDDLE_DB_AGENT_CONNECTIONS`).
    pub agent_db: sqlx::PgPool,
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
    /// Enrollment token uses taken in a block and not yet handed out (`token_uses.rs`).
    pub token_uses: Arc<token_uses::TokenUses>,
}

/// Connects to Postgres and applies migrations (serialised across replicas by sqlx's
/// advisory lock).
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
    crate::history::partitions::ensure(&pool, config.history_keep())
        .await
        .context("creating the history tables' monthly partitions")?;
    Ok(pool)
}

impl AppState {
    pub async fn new(config: Config) -> anyhow::Result<Self> {
        let db = connect(&config).await?;
        let agent_db = PgPoolOptions::new()
            .max_connections(config.db_agent_connections.max(1))
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with((*db.connect_options()).clone());
        let metrics = Arc::new(metrics::Metrics::new());
        metrics
            .pools
            .watch(vec![("main", db.clone()), ("agent", agent_db.clone())]);
        let plugins = Arc::new(plugins::PluginRuntime::from_config(&config)?);
        Ok(AppState {
            db,
            agent_db,
            credentials: Arc::new(credentials::CredentialCache::new(config.revocation_delay())),
            facts_seen: Arc::default(),
            job_env_seen: Arc::default(),
            token_uses: Arc::default(),
            config: Arc::new(config),
            metrics,
            plugins,
            db_reach: Arc::default(),
            liveness: Arc::default(),
        })
    }
}
