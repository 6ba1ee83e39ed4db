//! History maintenance, every `HEDDLE_HISTORY_INTERVAL_S` (default an hour): monthly
//! partitions created three months ahead (`history::partitions`), then expired months
//! dropped (`history::retention`), each dropped partition counted in
//! `heddle_history_partitions_dropped_total`. Safe on every replica: both hold one advisory
//! lock, and a replica that finds it taken does nothing this time.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::Worker;
use crate::config::Config;
use crate::history::{partitions, retention};
use crate::metrics::Metrics;
use crate::state::AppState;

pub struct History {
    db: sqlx::PgPool,
    config: Arc<Config>,
    metrics: Arc<Metrics>,
}

impl History {
    pub fn new(state: &AppState) -> Self {
        History {
            db: state.db.clone(),
            config: state.config.clone(),
            metrics: state.metrics.clone(),
        }
    }
}

impl Worker for History {
    const NAME: &'static str = "history";

    fn interval(&self) -> Duration {
        self.config.history_interval()
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        let keep = self.config.history_keep();
        let ahead = partitions::ensure(&self.db, keep)
            .await
            .map(|_| ())
            .context("history: creating months ahead");
        let swept = retention::sweep(&self.db, keep)
            .await
            .map(|dropped| {
                for d in dropped {
                    self.metrics.history_dropped(&d.table);
                }
            })
            .context("history: dropping expired months");
        super::steps([ahead, swept])
    }
}
