//! The lease reaper: [`leases::tick`] (the lease clock, then expiry, in one transaction)
//! four times per heartbeat interval, so an expired lease is noticed within a quarter
//! interval of expiring; records in `db_reach` whether the database answered. Safe on every
//! replica at once: the lease clock's row serialises the ticks (`leases.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::Worker;
use crate::config::Config;
use crate::db::reachability::Reachability;
use crate::jobs::JobError;
use crate::leases;
use crate::state::AppState;

pub struct LeaseReaper {
    db: sqlx::PgPool,
    config: Arc<Config>,
    db_reach: Arc<Reachability>,
}

impl LeaseReaper {
    pub fn new(state: &AppState) -> Self {
        LeaseReaper {
            db: state.db.clone(),
            config: state.config.clone(),
            db_reach: state.db_reach.clone(),
        }
    }
}

impl Worker for LeaseReaper {
    const NAME: &'static str = "lease_reaper";

    fn interval(&self) -> Duration {
        leases::tick_period(self.config.heartbeat_interval())
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        let heartbeat = self.config.heartbeat_interval();
        let margin = self.config.lease_margin();
        match leases::tick(&self.db, heartbeat, self.config.lease_ttl(), margin).await {
            Ok(_) => {
                self.db_reach.reached();
                Ok(())
            }
            Err(JobError::Database(err)) => {
                self.db_reach.failed(&err);
                Err(anyhow::Error::new(err).context("lease reaper: database error"))
            }
            Err(err) => Err(anyhow::Error::new(err).context("lease reaper")),
        }
    }
}
