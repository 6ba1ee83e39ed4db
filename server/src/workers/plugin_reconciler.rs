//! The plugin reconciler: every 5 s, or as soon as the plugin set changes, evaluates the
//! nodes whose plugin results are missing or stale ([`plugins::reconcile`]), and once every
//! [`plugins::SWEEP_EVERY`] first flags what the triggers missed ([`plugins::sweep`]).
//! Replicas divide the nodes among them by advisory lock (`plugins/reconciler.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Notify;

use super::Worker;
use crate::job_env::JobEnvSeen;
use crate::plugins::{self, PluginRuntime};
use crate::state::AppState;

/// The longest wait between two runs when nothing wakes the reconciler.
const IDLE: Duration = Duration::from_secs(5);

pub struct PluginReconciler {
    db: sqlx::PgPool,
    runtime: Arc<PluginRuntime>,
    job_env_seen: Arc<JobEnvSeen>,
    hold: Duration,
    /// When the last sweep succeeded.
    swept: Option<Instant>,
}

impl PluginReconciler {
    pub fn new(state: &AppState) -> Self {
        PluginReconciler {
            db: state.db.clone(),
            runtime: state.plugins.clone(),
            job_env_seen: state.job_env_seen.clone(),
            hold: Duration::from_millis(state.config.reconciler_hold_ms),
            swept: None,
        }
    }
}

impl Worker for PluginReconciler {
    const NAME: &'static str = "plugin_reconciler";

    fn interval(&self) -> Duration {
        IDLE
    }

    /// Plugin uploads, enables and disables, and the bundled plugins' registration.
    fn wake(&self) -> Option<&Notify> {
        Some(&self.runtime.wake)
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        let mut swept = Ok(());
        if self
            .swept
            .is_none_or(|t| t.elapsed() >= plugins::SWEEP_EVERY)
        {
            match plugins::sweep(&self.db).await {
                Ok(_) => self.swept = Some(Instant::now()),
                Err(err) => swept = Err(err).context("plugin staleness sweep"),
            }
        }
        // A failed sweep leaves the nodes that are already due to evaluate.
        let reconciled = plugins::reconcile(&self.db, &self.runtime, &self.job_env_seen, self.hold)
            .await
            .context("plugin reconciler");
        super::steps([swept, reconciled.map(|_| ())])
    }
}
