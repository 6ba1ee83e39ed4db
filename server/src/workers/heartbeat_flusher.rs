//! The heartbeat flusher: writes the heartbeats this replica recorded (`liveness.rs`) once
//! per flush interval, and once more when the server stops, so what it heard from its agents
//! reaches the database. A run is never cut off halfway; a failed one keeps what it held
//! for the next. Replicas flushing the same agent agree: timestamps only move forward.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::Worker;
use crate::config::Config;
use crate::liveness::Liveness;
use crate::state::AppState;

pub struct HeartbeatFlusher {
    liveness: Arc<Liveness>,
    config: Arc<Config>,
    /// A connection of its own, so that a pool busy with uploads cannot hold back the
    /// writes that keep leases alive.
    db: sqlx::PgPool,
}

impl HeartbeatFlusher {
    pub fn new(state: &AppState) -> Self {
        HeartbeatFlusher {
            liveness: state.liveness.clone(),
            config: state.config.clone(),
            db: crate::db::side_connection(&state.db),
        }
    }

    /// One flush, its failure reported with what waits for the next.
    async fn flush(&self) -> anyhow::Result<()> {
        let started = Instant::now();
        let done = self
            .liveness
            .flush(&self.db, self.config.lease_ttl())
            .await
            .with_context(|| {
                format!(
                    "flushing heartbeats failed; the {} pending are kept for the next flush",
                    self.liveness.pending()
                )
            })?;
        if done.agents > 0 {
            tracing::debug!(
                agents = done.agents,
                leases = done.leases,
                took_ms = started.elapsed().as_millis() as u64,
                "heartbeats flushed"
            );
        }
        Ok(())
    }
}

impl Worker for HeartbeatFlusher {
    const NAME: &'static str = "heartbeat_flusher";
    const DRAINS: bool = true;

    fn interval(&self) -> Duration {
        self.config.heartbeat_flush_interval()
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        self.flush().await
    }

    async fn stop(&mut self) -> anyhow::Result<()> {
        self.flush().await
    }
}
