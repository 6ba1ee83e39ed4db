//! Agent credentials checked once, then trusted from memory, with revocation kept within a
//! bound. At 50,000 agents a heartbeat every 10 s is 5,000 credential lookups a second;
//! answered from Postgres they were half of its load.
//!
//! A credential that Postgres accepted is remembered (its SHA-256 → agent and node). A
//! revocation — `DELETE /agents/{id}`, a re-enrollment, a decommissioned node — writes a row
//! to `agent_revocations` (a trigger, so no path can forget it), and every replica reads
//! that table every half `HEDDLE_REVOCATION_DELAY_MS` (`workers/revocation_feed.rs`) and
//! forgets what it names. The cache answers only while that feed is fresh: if its last
//! successful read started more than the delay ago (Postgres unreachable from this
//! replica, say), every request goes to the database as before. So a revocation made on any replica is honoured everywhere within
//! the delay, always; the replica that makes it forgets at once.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// How far back each read of the revocation log looks before the previous read: a
/// revocation whose transaction committed after that read but wrote its row earlier
/// (a transaction open for a while) is still seen.
const OVERLAP: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// Past this many remembered credentials the cache starts over (more agents than any
/// cluster; a flood of distinct valid credentials cannot grow memory without bound).
const MAX_ENTRIES: usize = 500_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cached {
    pub agent_id: Uuid,
    pub node_id: Uuid,
}

#[derive(Default)]
struct Inner {
    by_sha: HashMap<[u8; 32], Cached>,
    /// When the last successful read of the revocation log started, and the database's
    /// clock then (where the next read starts, less the overlap).
    fresh_since: Option<(Instant, DateTime<Utc>)>,
}

/// This replica's remembered agent credentials.
pub struct CredentialCache {
    inner: RwLock<Inner>,
    /// 0: no cache (every request reads Postgres).
    delay: Duration,
}

impl CredentialCache {
    pub fn new(delay: Duration) -> Self {
        CredentialCache {
            inner: RwLock::default(),
            delay,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The agent a credential's SHA-256 belongs to, if remembered and the revocation feed
    /// is fresh enough to trust it.
    pub fn get(&self, sha: &[u8; 32]) -> Option<Cached> {
        if self.delay.is_zero() {
            return None;
        }
        let inner = self.read();
        let (read_at, _) = inner.fresh_since?;
        if read_at.elapsed() > self.delay {
            return None;
        }
        inner.by_sha.get(sha).copied()
    }

    /// Remembers a credential Postgres accepted (unrevoked) in a lookup that started at
    /// `looked_up_at`. Not when a read of the revocation log started after that lookup:
    /// that read may have forgotten a revocation the lookup missed, and no later read
    /// would be the first to see it.
    pub fn insert(&self, sha: [u8; 32], entry: Cached, looked_up_at: Instant) {
        if self.delay.is_zero() {
            return;
        }
        let mut inner = self.write();
        match inner.fresh_since {
            Some((read_at, _)) if read_at <= looked_up_at => {}
            _ => return,
        }
        if inner.by_sha.len() >= MAX_ENTRIES {
            inner.by_sha.clear();
        }
        inner.by_sha.insert(sha, entry);
    }

    /// Forgets every credential of these agents.
    pub fn forget_agents(&self, agents: &[Uuid]) {
        if agents.is_empty() {
            return;
        }
        let gone: std::collections::HashSet<&Uuid> = agents.iter().collect();
        self.write()
            .by_sha
            .retain(|_, c| !gone.contains(&c.agent_id));
    }

    /// Forgets every credential of an agent of this node.
    pub fn forget_node(&self, node: Uuid) {
        self.write().by_sha.retain(|_, c| c.node_id != node);
    }

    /// How long a read of the revocation log is trusted; 0: the cache is off.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    pub fn len(&self) -> usize {
        self.read().by_sha.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks the feed as read at `at` (what a successful `refresh` does), for tests.
    #[cfg(test)]
    fn mark_read(&self, at: Instant) {
        self.write().fresh_since = Some((at, Utc::now()));
    }

    /// One read of the revocation log: forgets what it names and marks the feed fresh.
    pub async fn refresh(&self, db: &sqlx::PgPool) -> sqlx::Result<usize> {
        let started = Instant::now();
        let since = self.read().fresh_since.map(|(_, db_now)| db_now - OVERLAP);
        let row = sqlx::query!(
            r#"SELECT now() AS "db_now!",
                    coalesce((SELECT array_agg(DISTINCT agent_id) FROM agent_revocations
                              WHERE $1::timestamptz IS NULL OR at > $1), '{}') AS "revoked!""#,
            since,
        )
        .fetch_one(db)
        .await?;
        let (db_now, revoked): (DateTime<Utc>, Vec<Uuid>) = (row.db_now, row.revoked);
        let mut inner = self.write();
        if since.is_none() {
            // The first read: nothing remembered can predate it.
            inner.by_sha.clear();
        } else if !revoked.is_empty() {
            let gone: std::collections::HashSet<&Uuid> = revoked.iter().collect();
            inner.by_sha.retain(|_, c| !gone.contains(&c.agent_id));
        }
        inner.fresh_since = Some((started, db_now));
        Ok(revoked.len())
    }
}

#[cfg(test)]
mod tests;
