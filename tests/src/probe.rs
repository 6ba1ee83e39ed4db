//! What the load generator reads beside its own latencies, to say what bounded a run:
//! the CPU time of the servers, of Postgres (the postmaster and its backends, found
//! through a backend's parent) and of the generator itself, the machine's busy time, and
//! what Postgres's client backends were doing (`pg_stat_activity`, sampled).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Connection;

use crate::cpu_ticks;

/// The parent pid in `/proc/<pid>/stat`.
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The postmaster serving `database_url`, when it runs on this machine: the parent of the
/// backend that answers.
pub async fn postmaster_pid(database_url: &str) -> Option<u32> {
    let mut conn = sqlx::PgConnection::connect(database_url).await.ok()?;
    let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .ok()?;
    let parent = ppid(u32::try_from(backend).ok()?)?;
    // A backend's parent is the postmaster, whose own /proc entry must exist here.
    std::path::Path::new(&format!("/proc/{parent}"))
        .exists()
        .then_some(parent)
}

/// CPU ticks of the postmaster and every process it started (backends, WAL writer,
/// checkpointer). A backend that exits takes its ticks with it; pooled ones stay.
pub fn tree_ticks(root: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid == root || ppid(pid) == Some(root))
        .filter_map(cpu_ticks)
        .sum()
}

/// (busy, total) ticks of the whole machine, from `/proc/stat`.
pub fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = f.iter().take(8).sum();
    // idle and iowait are not busy.
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

/// Samples `pg_stat_activity` for the client backends of one database every `every`
/// until dropped; [`Activity::means`] is the mean count per "state/wait event", followed
/// for active backends, and for those idle inside a transaction, by the first
/// `query_chars` characters of their statement (for an idle one, the last it ran: what
/// its transaction did before the client went off to do something else; "active/cpu" is
/// a backend running with no wait event).
pub struct Activity {
    sums: Arc<Mutex<(BTreeMap<String, u64>, u64)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Activity {
    pub async fn start(
        database_url: &str,
        every: Duration,
        query_chars: i32,
    ) -> anyhow::Result<Activity> {
        let mut conn = sqlx::PgConnection::connect(database_url).await?;
        let sums = Arc::new(Mutex::new((BTreeMap::new(), 0)));
        let into = sums.clone();
        let task = tokio::spawn(async move {
            loop {
                let rows: Result<Vec<(String, i64)>, _> = sqlx::query_as(
                    "SELECT coalesce(state, '?') || '/' || coalesce(wait_event_type || ':' || wait_event, 'cpu')
                            || CASE WHEN state IN ('active', 'idle in transaction') THEN ' ' || left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), $1) ELSE '' END,
                            count(*)
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND backend_type = 'client backend'
                       AND pid <> pg_backend_pid()
                     GROUP BY 1",
                )
                .bind(query_chars)
                .fetch_all(&mut conn)
                .await;
                let Ok(rows) = rows else { return };
                {
                    let mut s = into.lock().unwrap();
                    for (k, n) in rows {
                        *s.0.entry(k).or_default() += n as u64;
                    }
                    s.1 += 1;
                }
                tokio::time::sleep(every).await;
            }
        });
        Ok(Activity { sums, task })
    }

    pub fn means(&self) -> BTreeMap<String, f64> {
        let s = self.sums.lock().unwrap();
        s.0.iter()
            .map(|(k, v)| (k.clone(), *v as f64 / s.1.max(1) as f64))
            .collect()
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// CPU use of each part over one window, in percent of one core.
pub struct CpuWindow {
    servers: Vec<(u32, u64)>,
    postgres: Option<(u32, u64)>,
    generator: u64,
    machine: (u64, u64),
    started: std::time::Instant,
}

impl CpuWindow {
    pub fn start(servers: &[u32], postmaster: Option<u32>) -> CpuWindow {
        CpuWindow {
            servers: servers
                .iter()
                .map(|&p| (p, cpu_ticks(p).unwrap_or(0)))
                .collect(),
            postgres: postmaster.map(|p| (p, tree_ticks(p))),
            generator: cpu_ticks(std::process::id()).unwrap_or(0),
            machine: machine_ticks(),
            started: std::time::Instant::now(),
        }
    }

    /// `{"servers": [..], "postgres": .., "generator": .., "machine_busy": ..}`; the
    /// machine's figure is in percent of all its cores.
    pub fn end(&self) -> serde_json::Value {
        const TICKS: f64 = 100.0; // USER_HZ on Linux
        let secs = self.started.elapsed().as_secs_f64();
        let pct = |t: u64| t as f64 / TICKS / secs * 100.0;
        let servers: Vec<f64> = self
            .servers
            .iter()
            .map(|&(p, t0)| pct(cpu_ticks(p).unwrap_or(0).saturating_sub(t0)))
            .collect();
        let postgres = self
            .postgres
            .map(|(p, t0)| pct(tree_ticks(p).saturating_sub(t0)));
        let generator = pct(cpu_ticks(std::process::id())
            .unwrap_or(0)
            .saturating_sub(self.generator));
        let (busy, total) = machine_ticks();
        let machine =
            (busy - self.machine.0) as f64 / (total - self.machine.1).max(1) as f64 * 100.0;
        serde_json::json!({"servers": servers, "postgres": postgres, "generator": generator,
            "machine_busy": machine})
    }
}
