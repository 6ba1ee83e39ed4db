//! The job environment versions worker: every 5 s, or as soon as a heartbeat finds a
//! node's version unknown or a write here makes some unknown, computes the unknown
//! versions in batches ([`job_env::refresh_due`]) until none is left, so that heartbeats
//! only ever read one, and keeps them in this replica's memory so that its heartbeats read
//! nothing. Replicas share the batches by `SKIP LOCKED`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::Notify;

use super::Worker;
use crate::job_env::{self, JobEnvSeen};
use crate::state::AppState;

/// The longest wait between two runs when nothing wakes the worker (a write through
/// another replica is found by its heartbeats' reads, which wake it here).
const IDLE: Duration = Duration::from_secs(5);

/// One run stops after this, leaving the rest to the next, so that a stop is not held up.
const RUN_FOR: Duration = Duration::from_secs(10);

pub struct JobEnvVersions {
    db: sqlx::PgPool,
    seen: Arc<JobEnvSeen>,
}

impl JobEnvVersions {
    pub fn new(state: &AppState) -> Self {
        JobEnvVersions {
            db: state.db.clone(),
            seen: state.job_env_seen.clone(),
        }
    }
}

impl Worker for JobEnvVersions {
    const NAME: &'static str = "job_env_versions";

    fn interval(&self) -> Duration {
        IDLE
    }

    fn wake(&self) -> Option<&Notify> {
        Some(&self.seen.due)
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let forgets = self.seen.forgets();
            let stored = job_env::refresh_due(&self.db, job_env::REFRESH_BATCH)
                .await
                .context("computing unknown job environment versions")?;
            // This replica's heartbeats answer them from memory from now on, unless a write
            // here came in between (its nodes are NULL again in the database).
            self.seen.set_computed(forgets, &stored);
            if (stored.len() as i64) < job_env::REFRESH_BATCH || started.elapsed() > RUN_FOR {
                return Ok(());
            }
        }
    }
}
