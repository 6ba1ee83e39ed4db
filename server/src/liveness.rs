//! Heartbeats off the write path. A heartbeat is recorded here, in this replica's memory,
//! and a worker (`workers/heartbeat_flusher.rs`) writes everything recorded once per flush
//! interval: one statement for the agents and nodes seen, one for the leases of the jobs
//! they said they run, in one transaction. At 50,000 agents that is two statements every
//! interval instead of 5,000 row writes a second.
//!
//! What this replica holds is only the last flush interval's news: losing the replica
//! loses at most that much liveness, never a job or a result (claims, renewals through
//! `/renew` and results are written at once). The lease reaper allows for it with a margin
//! of one flush interval (`Config::lease_margin`). A failed flush keeps what it held for
//! the next one; a graceful shutdown flushes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

/// The latest heartbeat of one agent that is not yet in the database.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    node_id: Uuid,
    /// When it arrived, on this process's monotonic clock: written as the database's
    /// `now()` less its age, so every timestamp is on the database's clock.
    at: Instant,
    version: Option<String>,
    /// Jobs the agent said it runs that are still leased to it (checked when recorded).
    jobs: Vec<Uuid>,
}

/// Heartbeats recorded on this replica since the last flush.
#[derive(Default)]
pub struct Liveness {
    pending: Mutex<HashMap<Uuid, Seen>>,
}

/// The facts hash stored for each node, as this replica last read or wrote it, so that a
/// heartbeat whose agent reports the same hash needs no read. Only the agent of a node
/// writes its facts, and it reports the hash of its last accepted upload, so a match is
/// the stored value whichever replica took that upload; a mismatch is read from Postgres.
/// Entries are dropped after `FACTS_SEEN_TTL`, so a database restored from a backup is
/// asked again within that time.
#[derive(Default)]
pub struct FactsSeen {
    by_node: std::sync::RwLock<HashMap<Uuid, (String, Instant)>>,
}

const FACTS_SEEN_TTL: Duration = Duration::from_secs(600);
const FACTS_SEEN_MAX: usize = 500_000;

impl FactsSeen {
    /// Whether the node's agent should send its facts, when memory can tell: the node's
    /// stored hash is known and the agent reports it (or reports none: the answer Postgres
    /// would give too). `None`: ask Postgres.
    pub fn send_facts(&self, node: Uuid, theirs: Option<&str>) -> Option<bool> {
        let by_node = self.by_node.read().unwrap_or_else(|e| e.into_inner());
        let (known, at) = by_node.get(&node)?;
        (at.elapsed() < FACTS_SEEN_TTL && theirs.is_none_or(|t| t == known)).then_some(false)
    }

    /// Notes the facts hash stored for `node` (just read, or just written and committed).
    pub fn set(&self, node: Uuid, sha: &str) {
        let mut by_node = self.by_node.write().unwrap_or_else(|e| e.into_inner());
        if by_node.len() >= FACTS_SEEN_MAX {
            by_node.clear();
        }
        by_node.insert(node, (sha.to_string(), Instant::now()));
    }
}

/// What one flush wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    pub agents: u64,
    pub leases: u64,
}

impl Liveness {
    /// Notes that `agent_id` (of `node_id`) heartbeated now, running `jobs` (those of them
    /// still leased to it).
    pub fn record(&self, agent_id: Uuid, node_id: Uuid, version: Option<String>, jobs: Vec<Uuid>) {
        let seen = Seen {
            node_id,
            at: Instant::now(),
            version,
            jobs,
        };
        self.lock().insert(agent_id, seen);
    }

    /// Heartbeats waiting for the next flush.
    pub fn pending(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Seen>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts back what a failed flush took, unless a newer heartbeat came meanwhile.
    fn restore(&self, taken: HashMap<Uuid, Seen>) {
        let mut pending = self.lock();
        for (agent, seen) in taken {
            pending.entry(agent).or_insert(seen);
        }
    }

    /// Writes every pending heartbeat: agents' `last_heartbeat_at` and version, their nodes'
    /// `last_seen_at`, and the leases of the jobs they run. Timestamps only move forward, so
    /// replicas flushing the same agent in any order agree.
    pub async fn flush(&self, db: &sqlx::PgPool, lease_ttl: Duration) -> sqlx::Result<Flushed> {
        let taken = std::mem::take(&mut *self.lock());
        if taken.is_empty() {
            return Ok(Flushed::default());
        }
        match write(db, &taken, lease_ttl).await {
            Ok(done) => Ok(done),
            Err(err) => {
                self.restore(taken);
                Err(err)
            }
        }
    }
}

async fn write(
    db: &sqlx::PgPool,
    seen: &HashMap<Uuid, Seen>,
    lease_ttl: Duration,
) -> sqlx::Result<Flushed> {
    let n = seen.len();
    let now = Instant::now();
    let (mut agents, mut nodes, mut ages, mut versions) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut job_ids, mut job_agents, mut job_ages) = (Vec::new(), Vec::new(), Vec::new());
    for (agent, s) in seen {
        let age = now.saturating_duration_since(s.at).as_secs_f64();
        agents.push(*agent);
        nodes.push(s.node_id);
        ages.push(age);
        versions.push(s.version.clone());
        for job in &s.jobs {
            job_ids.push(*job);
            job_agents.push(*agent);
            job_ages.push(age);
        }
    }
    let mut tx = db.begin().await?;
    sqlx::query!(
        "WITH seen AS (
             SELECT agent_id, node_id, now() - make_interval(secs => age) AS at, version
             FROM unnest($1::uuid[], $2::uuid[], $3::float8[], $4::text[])
                 AS s(agent_id, node_id, age, version)),
         a AS (
             UPDATE agents SET last_heartbeat_at = greatest(agents.last_heartbeat_at, seen.at),
                    version = coalesce(seen.version, agents.version)
             FROM seen WHERE agents.id = seen.agent_id
             RETURNING agents.id),
         latest AS (SELECT node_id, max(at) AS at FROM seen GROUP BY node_id)
         UPDATE nodes SET last_seen_at = greatest(nodes.last_seen_at, latest.at)
         FROM latest WHERE nodes.id = latest.node_id",
        &agents,
        &nodes,
        &ages,
        &versions as &[Option<String>],
    )
    .execute(&mut *tx)
    .await?;
    let leases =
        crate::jobs::store::heartbeat_batch(&mut tx, &job_ids, &job_agents, &job_ages, lease_ttl)
            .await
            .map_err(|e| match e {
                crate::jobs::JobError::Database(e) => e,
                other => sqlx::Error::Protocol(other.to_string()),
            })?;
    tx.commit().await?;
    Ok(Flushed {
        agents: n as u64,
        leases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_heartbeat_of_an_agent_wins_and_a_failed_flush_keeps_it() {
        let live = Liveness::default();
        let (agent, node, job) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        live.record(agent, node, Some("1".into()), vec![]);
        live.record(agent, node, Some("2".into()), vec![job]);
        assert_eq!(live.pending(), 1);
        let taken = std::mem::take(&mut *live.lock());
        assert_eq!(taken[&agent].version.as_deref(), Some("2"));
        assert_eq!(taken[&agent].jobs, vec![job]);
        // A heartbeat arriving while the flush failed is newer than what the flush held.
        live.record(agent, node, Some("3".into()), vec![]);
        live.restore(taken);
        assert_eq!(live.lock()[&agent].version.as_deref(), Some("3"));
    }
}
