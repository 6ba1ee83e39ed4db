//! Investigation stepping, at most once a second and four times per heartbeat interval when
//! that is shorter: judges results still without a verdict, starts investigations for runs
//! whose verdicts call for one, and advances the running ones (`investigate/advance.rs`:
//! one investigation row locked with `SKIP LOCKED` at a time, so a batch is started once
//! however many replicas step at the same time), then the fabric investigations
//! (`investigate/fabric.rs`, the same way). Each step goes on when an earlier one failed.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::Worker;
use crate::config::Config;
use crate::state::AppState;
use crate::{health, investigate};

pub struct Investigations {
    db: sqlx::PgPool,
    config: Arc<Config>,
}

impl Investigations {
    pub fn new(state: &AppState) -> Self {
        Investigations {
            db: state.db.clone(),
            config: state.config.clone(),
        }
    }
}

impl Worker for Investigations {
    const NAME: &'static str = "investigations";

    fn interval(&self) -> Duration {
        (self.config.heartbeat_interval() / 4).min(Duration::from_secs(1))
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        // Verdicts first: automatic investigations start from them.
        let judged = health::verdict::judge_pending(&self.db)
            .await
            .map(|_| ())
            .context("judging results without a verdict");
        let triggered = investigate::trigger_from_verdicts(&self.db)
            .await
            .map(|_| ())
            .context("investigations: starting automatic ones");
        let advanced = investigate::advance_all(&self.db)
            .await
            .map(|_| ())
            .context("investigations: advancing");
        let fabric = investigate::fabric::advance_all(&self.db)
            .await
            .map(|_| ())
            .context("fabric investigations: advancing");
        super::steps([judged, triggered, advanced, fabric])
    }
}
