//! A node's job environment: what every NCCL job on the node gets through Heddle's NCCL
//! environment plugin, from the node env file its agent keeps (docs/jobs.md). It is the
//! node's environment (`recommendations::effective`, what `heddle env NODE` exports) as
//! `nccl_conf` entries, less what a conf file cannot carry, less what the rank-agreement
//! rule leaves out (`rank_disagreed`). This module is the one place it is computed.
//!
//! Its version (`nccl_conf::job_env_sha256`) rides on every heartbeat answer, which is
//! answered from memory, so the version is stored in `nodes.job_env_sha256` and cached per
//! replica. Writers of recommendations, tuning profiles or a node's site set the column to
//! NULL in their transaction ([`mark_changed`]); the versions worker computes the unknown
//! ones in batches under their rows' locks ([`refresh_due`]), so a value computed before a
//! write can never be stored after it. A heartbeat never computes one: until it is stored,
//! the heartbeat carries none and the agent keeps its file (a fleet's first heartbeats
//! computing 1,000 environments a second, each in a transaction of its own, were what
//! slowed every agent request at 10,000 agents: docs/benchmarks.md).

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use heddle_types::agent::NodeJobEnv;
use heddle_types::health::{Reason, Severity};
use heddle_types::must_agree::{self, LeftOut};
use heddle_types::nccl_conf::{self, Entry};
use sqlx::PgConnection;
use uuid::Uuid;

pub use crate::db::job_env_version::{Changed, mark_changed};

mod versions;
pub use versions::{REFRESH_BATCH, refresh_due};

/// A node's job environment: what its file carries, in name order, and what the
/// rank-agreement rule left out.
pub struct Computed {
    pub entries: Vec<Entry>,
    pub left_out: Vec<LeftOut>,
}

/// The node's job environment.
pub async fn job_env(conn: &mut PgConnection, node: Uuid) -> sqlx::Result<Computed> {
    let mut by_node = job_envs(conn, &[node]).await?;
    Ok(by_node.remove(&node).unwrap_or(Computed {
        entries: Vec::new(),
        left_out: Vec::new(),
    }))
}

/// The job environments of `nodes`: their environments read in two queries whatever their
/// number (`recommendations::explain_many`), then the rank-agreement rule for each node
/// that has a must-agree variable.
pub async fn job_envs(
    conn: &mut PgConnection,
    nodes: &[Uuid],
) -> sqlx::Result<HashMap<Uuid, Computed>> {
    let envs = crate::recommendations::explain_many(conn, nodes, None).await?;
    let mut out = HashMap::with_capacity(envs.len());
    for (node, recs) in envs {
        out.insert(node, agreed(conn, node, recs).await?);
    }
    Ok(out)
}

/// One node's environment as its file may carry it.
async fn agreed(
    conn: &mut PgConnection,
    node: Uuid,
    recs: Vec<heddle_types::recommend::ExplainedVar>,
) -> sqlx::Result<Computed> {
    let mut entries = Vec::with_capacity(recs.len());
    for r in recs {
        let ok = nccl_conf::check_node_entry(&r.name, &r.value)
            .and_then(|()| nccl_conf::check_conf_value(&r.name, &r.value));
        match ok {
            Ok(()) => entries.push(Entry {
                name: r.name,
                value: r.value,
            }),
            Err(why) => {
                tracing::warn!(%node, name = %r.name, source = %r.source, %why, "left out of the node's job environment")
            }
        }
    }
    let left_out = rank_disagreed(conn, node, &entries).await?;
    for l in &left_out {
        tracing::warn!(%node, name = %l.name, code = %l.code, message = %l.message, "left out of the node's job environment");
    }
    entries.retain(|e| !left_out.iter().any(|l| l.name == e.name));
    Ok(Computed { entries, left_out })
}

/// What the node's health says of its job environment: a warning coded
/// `env-splits-communicator` for each must-agree variable its file leaves out, naming the
/// nodes that differ (docs/jobs.md). Computed when read, as the node's checks are, so a
/// profile written on a peer shows on this node at once.
pub async fn health_reasons(db: &sqlx::PgPool, node: Uuid) -> sqlx::Result<Vec<Reason>> {
    let mut conn = db.acquire().await?;
    let Computed { left_out, .. } = job_env(&mut conn, node).await?;
    Ok(left_out.into_iter().map(left_out_reason).collect())
}

fn left_out_reason(l: LeftOut) -> Reason {
    Reason {
        severity: Severity::Warn,
        message: l.message,
        metric: None,
        observed: None,
        expected: None,
        basis: "environment".into(),
        code: Some(l.code),
        evidence: (!l.differing_nodes.is_empty())
            .then(|| format!("differs on: {}", l.differing_nodes.join(" "))),
    }
}

/// Largest site whose members' environments are compared; beyond it, must-agree variables
/// are left out rather than read from every member on each recomputation.
pub const MAX_SITE_COMPARED: i64 = 256;

/// The rank-agreement rule (`heddle_types::must_agree`): a variable that must be equal on
/// every rank of a communicator is written only when every node of the node's site has the
/// same value, because a job's ranks span nodes and each reads its own node's file. A node
/// with no site, or in a site too large to compare ([`MAX_SITE_COMPARED`]), cannot show
/// that agreement, so it gets none of them (a site-wide tuning profile, or the job's own
/// setting, is how such a value reaches jobs). Returns the entries to leave out, each a
/// warning coded `env-splits-communicator`. The peers' values are read in two queries
/// limited to the must-agree names the node has, whatever the site's size.
async fn rank_disagreed(
    conn: &mut PgConnection,
    node: Uuid,
    entries: &[Entry],
) -> sqlx::Result<Vec<LeftOut>> {
    use std::collections::BTreeMap;
    let mine: BTreeMap<String, String> = entries
        .iter()
        .filter(|e| must_agree::must_agree(&e.name))
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    if mine.is_empty() {
        return Ok(Vec::new());
    }
    let me = sqlx::query!("SELECT hostname, site_id FROM nodes WHERE id = $1", node)
        .fetch_one(&mut *conn)
        .await?;
    let (hostname, site) = (me.hostname, me.site_id);
    let peers: Vec<(Uuid, String)> = match site {
        Some(site) => sqlx::query!(
            "SELECT id, hostname FROM nodes WHERE site_id = $1 AND id <> $2 ORDER BY hostname LIMIT $3",
            site,
            node,
            MAX_SITE_COMPARED,
        )
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|p| (p.id, p.hostname))
        .collect(),
        None => Vec::new(),
    };
    if site.is_none() || (peers.len() as i64) >= MAX_SITE_COMPARED {
        let why = if site.is_none() {
            "the node has no site, so no agreement with the nodes its jobs span can be shown"
        } else {
            "the node's site is too large to compare every member"
        };
        return Ok(mine
            .into_iter()
            .map(|(name, value)| must_agree::LeftOut::unshown(name, value, why))
            .collect());
    }
    let names: Vec<&str> = mine.keys().map(String::as_str).collect();
    let ids: Vec<Uuid> = peers.iter().map(|(id, _)| *id).collect();
    let mut envs = crate::recommendations::explain_many(conn, &ids, Some(&names)).await?;
    let peer_envs: Vec<(String, BTreeMap<String, String>)> = peers
        .into_iter()
        .map(|(id, host)| {
            let env = envs
                .remove(&id)
                .unwrap_or_default()
                .into_iter()
                .map(|v| (v.name, v.value))
                .collect();
            (host, env)
        })
        .collect();
    Ok(must_agree::job_env_leave_out(
        &hostname,
        &mine,
        peer_envs.iter().map(|(n, e)| (n.as_str(), e)),
    ))
}

/// The node's job environment and its version, computed now and stored as the node's
/// version (under the node's row lock, so a concurrent write either waits for this or is
/// seen by it). `None`: no such node.
pub async fn current(db: &sqlx::PgPool, node: Uuid) -> sqlx::Result<Option<NodeJobEnv>> {
    // Almost always the stored version is the one computed now (the versions worker keeps
    // it so): computed outside a transaction, nothing locked and nothing written.
    {
        let mut conn = db.acquire().await?;
        let stored = sqlx::query!(
            "SELECT hostname, job_env_sha256 FROM nodes WHERE id = $1",
            node
        )
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| (r.hostname, r.job_env_sha256));
        let Some((hostname, Some(stored))) = stored else {
            return current_locked(db, node).await;
        };
        let Computed { entries, left_out } = job_env(&mut conn, node).await?;
        let sha = nccl_conf::job_env_sha256(&entries)
            .map_err(|e| sqlx::Error::Protocol(format!("job environment of node {node}: {e}")))?;
        if sha == stored {
            return Ok(Some(NodeJobEnv {
                node: hostname,
                job_env_sha256: sha,
                entries,
                left_out,
            }));
        }
    }
    current_locked(db, node).await
}

/// [`current`] under the node's row lock, storing the version it computes.
async fn current_locked(db: &sqlx::PgPool, node: Uuid) -> sqlx::Result<Option<NodeJobEnv>> {
    let mut tx = db.begin().await?;
    let stored = sqlx::query!(
        "SELECT hostname, job_env_sha256 FROM nodes WHERE id = $1 FOR UPDATE",
        node
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| (r.hostname, r.job_env_sha256));
    let Some((hostname, stored)) = stored else {
        return Ok(None);
    };
    let Computed { entries, left_out } = job_env(&mut tx, node).await?;
    let sha = nccl_conf::job_env_sha256(&entries)
        .map_err(|e| sqlx::Error::Protocol(format!("job environment of node {node}: {e}")))?;
    if stored.as_deref() != Some(sha.as_str()) {
        sqlx::query!(
            "UPDATE nodes SET job_env_sha256 = $2 WHERE id = $1",
            node,
            sha
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Some(NodeJobEnv {
        node: hostname,
        job_env_sha256: sha,
        entries,
        left_out,
    }))
}

/// How long a replica trusts a job environment version it read: a change made through
/// another replica reaches heartbeats answered here within this (the replica that made it
/// forgets at once). At 50,000 agents it is one read of a node's row per node every two
/// minutes, shared with the facts hash check.
const SEEN_TTL: Duration = Duration::from_secs(120);
const SEEN_MAX: usize = 500_000;

/// Each node's job environment version as this replica last read it.
#[derive(Default)]
pub struct JobEnvSeen {
    by_node: RwLock<HashMap<Uuid, (String, Instant)>>,
    /// Counts [`JobEnvSeen::forget`]s, so that versions computed before one are not put
    /// back after it ([`JobEnvSeen::set_computed`]).
    forgets: std::sync::atomic::AtomicU64,
    /// Wakes the versions worker (`workers/job_env_versions.rs`): a heartbeat found a node
    /// whose version is not stored, or a write here made some unknown.
    pub due: tokio::sync::Notify,
}

impl JobEnvSeen {
    /// The node's version, if read within [`SEEN_TTL`].
    pub fn get(&self, node: Uuid) -> Option<String> {
        let by_node = self.by_node.read().unwrap_or_else(|e| e.into_inner());
        let (sha, at) = by_node.get(&node)?;
        (at.elapsed() < SEEN_TTL).then(|| sha.clone())
    }

    pub fn set(&self, node: Uuid, sha: &str) {
        let mut by_node = self.by_node.write().unwrap_or_else(|e| e.into_inner());
        if by_node.len() >= SEEN_MAX {
            by_node.clear();
        }
        by_node.insert(node, (sha.to_string(), Instant::now()));
    }

    /// How many forgets so far: read before computing versions to give to
    /// [`JobEnvSeen::set_computed`].
    pub fn forgets(&self) -> u64 {
        self.forgets.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Versions computed since `forgets` was read, kept only if nothing was forgotten
    /// meanwhile: a write that committed during the computation may have made them stale
    /// (the database has them as NULL again then, and heartbeats read that).
    pub fn set_computed(&self, forgets: u64, versions: &[(Uuid, String)]) {
        let mut by_node = self.by_node.write().unwrap_or_else(|e| e.into_inner());
        if self.forgets() != forgets {
            return;
        }
        if by_node.len() + versions.len() >= SEEN_MAX {
            by_node.clear();
        }
        let now = Instant::now();
        for (node, sha) in versions {
            by_node.insert(*node, (sha.clone(), now));
        }
    }

    /// After a write committed here: its nodes are read again on their next heartbeat.
    pub fn forget(&self, nodes: &[Uuid]) {
        {
            let mut by_node = self.by_node.write().unwrap_or_else(|e| e.into_inner());
            self.forgets
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            for n in nodes {
                by_node.remove(n);
            }
        }
        if !nodes.is_empty() {
            self.due.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_node_is_read_again() {
        let seen = JobEnvSeen::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        seen.set(a, "x");
        seen.set(b, "y");
        assert_eq!(seen.get(a).as_deref(), Some("x"));
        seen.forget(&[a]);
        assert_eq!(seen.get(a), None);
        assert_eq!(seen.get(b).as_deref(), Some("y"));
    }

    #[test]
    fn versions_computed_before_a_forget_are_not_put_back() {
        let seen = JobEnvSeen::default();
        let a = Uuid::new_v4();
        let before = seen.forgets();
        // A write lands while the batch computes: what it computed may be stale.
        seen.forget(&[a]);
        seen.set_computed(before, &[(a, "stale".into())]);
        assert_eq!(seen.get(a), None);
        seen.set_computed(seen.forgets(), &[(a, "fresh".into())]);
        assert_eq!(seen.get(a).as_deref(), Some("fresh"));
    }
}
