//! The revocation feed: reads the revocation log (`agent_revocations`) every half
//! `HEDDLE_REVOCATION_DELAY_MS` so that remembered agent credentials are forgotten within
//! the delay (`credentials.rs`), and once every ten minutes trims the log of rows every
//! replica has read long ago. Not started when the delay is 0 (no credential is
//! remembered). A failed read is logged at DEBUG only: until the feed is fresh again,
//! credentials are checked in Postgres, as without the cache.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::Worker;
use crate::credentials::CredentialCache;
use crate::state::AppState;

/// How often the log is trimmed.
const TRIM_EVERY: Duration = Duration::from_secs(600);

pub struct RevocationFeed {
    cache: Arc<CredentialCache>,
    /// A connection of its own: a pool busy with claims and uploads must not delay the
    /// reads, or every replica would distrust its memory and send every heartbeat to that
    /// same busy pool.
    db: sqlx::PgPool,
    last_trim: Instant,
}

impl RevocationFeed {
    /// `None` when the cache is off.
    pub fn new(state: &AppState) -> Option<Self> {
        (!state.credentials.delay().is_zero()).then(|| RevocationFeed {
            cache: state.credentials.clone(),
            db: crate::db::side_connection(&state.db),
            last_trim: Instant::now(),
        })
    }
}

impl Worker for RevocationFeed {
    const NAME: &'static str = "revocation_feed";
    const FAILURES: tracing::Level = tracing::Level::DEBUG;

    fn interval(&self) -> Duration {
        (self.cache.delay() / 2).max(Duration::from_millis(10))
    }

    async fn run(&mut self) -> anyhow::Result<()> {
        self.cache.refresh(&self.db).await.context(
            "reading agent revocations failed; credentials are checked in Postgres until it answers",
        )?;
        if self.last_trim.elapsed() > TRIM_EVERY {
            self.last_trim = Instant::now();
            sqlx::query!("DELETE FROM agent_revocations WHERE at < now() - interval '1 hour'")
                .execute(&self.db)
                .await
                .context("trimming agent revocations failed")?;
        }
        Ok(())
    }
}
