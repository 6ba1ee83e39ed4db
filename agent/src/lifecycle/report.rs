//! Heartbeats and facts: how the server learns the agent is alive and what its node is.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use heddle_types::agent::HeartbeatRequest;
use tokio::time::Instant;

use super::{AGENT_VERSION, Agent, Backoff, LifecycleError, facts_link};
use crate::client::ClientError;

/// Heartbeats at the interval the server names. A heartbeat also renews the leases of the
/// running jobs, and names those the agent must stop.
pub(super) async fn heartbeat_loop(agent: Arc<Agent>) -> Result<Infallible, LifecycleError> {
    let mut backoff = Backoff::new(Duration::from_secs(1), agent.cfg.backoff_cap);
    let mut down_since: Option<Instant> = None;
    loop {
        let req = HeartbeatRequest {
            agent_version: Some(AGENT_VERSION.to_string()),
            facts_sha256: agent.facts_sha.lock().expect("facts lock").clone(),
            running_jobs: agent.held_jobs(),
        };
        let sent = wall_ns();
        let delay = match agent.client.heartbeat(&req).await {
            Ok(resp) => {
                if let Some(server) = resp.server_time_ns {
                    let got = wall_ns();
                    *agent.clock.lock().expect("clock lock") =
                        Some(clock_offset(sent, got, server));
                }
                if let Some(since) = down_since.take() {
                    tracing::info!(server = agent.client.current_server(), down_for = ?since.elapsed(), "server reachable again");
                    // Spooled results and claims need not wait out their own backoff.
                    agent.server_back.notify_waiters();
                }
                backoff.reset();
                agent.set_heartbeat_interval(resp.heartbeat_interval_s);
                if resp.send_facts {
                    agent.facts_wake.notify_one();
                }
                if let Some(version) = resp.job_env_sha256 {
                    agent.job_env_wanted.send_if_modified(|cur| {
                        let new = cur.as_ref() != Some(&version);
                        *cur = Some(version);
                        new
                    });
                }
                // A cancelled job whose result waits in the spool has nothing left to stop.
                let running = agent.running_jobs();
                for id in resp
                    .cancel_jobs
                    .into_iter()
                    .filter(|id| running.contains(id))
                {
                    tracing::info!(job_id = %id, "server asks to stop a job; confirming with a renewal");
                    agent.check_job(id);
                }
                agent.heartbeat_interval()
            }
            Err(ClientError::Unauthorized { message }) => return Err(agent.revoked(message)),
            Err(err) => {
                down_since.get_or_insert_with(Instant::now);
                // Retry with backoff (not sooner than the server asks), but never later than
                // half an interval: the agent is heard from within a heartbeat interval of
                // the server's (or its database's) return, well inside the fresh lease term
                // the server grants after an outage.
                let delay = backoff
                    .next_delay_after(err.retry_after())
                    .min(agent.heartbeat_interval() / 2);
                tracing::warn!(error = %err, retry_in = ?delay, failures = backoff.failures(), "heartbeat failed");
                delay
            }
        };
        touch_alive(&agent.identity_path);
        tokio::time::sleep(delay).await;
    }
}

/// The wall clock in ns since the Unix epoch.
fn wall_ns() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
}

/// The server's clock minus this node's, from a round trip sent at `sent` and answered at
/// `got` (node clock) with the server's `server` time: the answer was made somewhere in
/// between, so the middle is off by at most half the round trip.
fn clock_offset(sent: i64, got: i64, server: i64) -> heddle_types::observed::ClockOffset {
    let mid = sent + (got - sent) / 2;
    heddle_types::observed::ClockOffset {
        offset_ns: server - mid,
        error_ns: ((got - sent).max(0) / 2) as u64,
    }
}

/// Touches `alive` beside the identity after every heartbeat attempt, reachable server or
/// not: a container liveness probe reads its age, so a stuck agent is restarted and a
/// server outage restarts nothing.
fn touch_alive(identity: &std::path::Path) {
    let path = identity.with_file_name("alive");
    if let Err(e) = std::fs::File::create(&path) {
        tracing::debug!(path = %path.display(), error = %e, "cannot touch the liveness file");
    }
}

/// Sends facts at start, whenever a periodic collection finds them changed, and when the
/// server asks for them.
pub(super) async fn facts_loop(agent: Arc<Agent>) -> Result<Infallible, LifecycleError> {
    let mut backoff = Backoff::new(Duration::from_secs(1), agent.cfg.backoff_cap);
    let mut sent_sha: Option<String> = None;
    let mut force = true;
    // After the server refused a document, requests for facts are not answered with the
    // same document again until the next collection.
    let mut refused_sha: Option<String> = None;
    let mut last_sent: Option<Instant> = None;
    // The facts the GPU map beside the node env file was last computed from.
    let mut map_sha: Option<String> = None;
    loop {
        let (hostname, root) = (agent.hostname.clone(), agent.cfg.facts_root.clone());
        let doc = tokio::task::spawn_blocking(move || facts_link::collect(&hostname, &root))
            .await
            .expect("fact collection does not panic");
        if map_sha.as_deref() != Some(doc.sha256.as_str())
            || !crate::gpu_map::beside(&agent.cfg.node_env.path).exists()
        {
            map_sha = write_gpu_map(&agent, &doc).await;
        }
        let changed = sent_sha.as_deref() != Some(doc.sha256.as_str());
        // A request for facts that crossed our own sending of them needs no second copy.
        let just_sent = last_sent.is_some_and(|t| t.elapsed() < agent.heartbeat_interval());
        if (changed || (force && !just_sent)) && refused_sha.as_deref() != Some(doc.sha256.as_str())
        {
            match agent.client.put_facts(&doc.json, &doc.sha256).await {
                Ok(accepted) => {
                    tracing::info!(sha256 = %doc.sha256, changed = accepted.changed, "facts sent");
                    *agent.facts_sha.lock().expect("facts lock") = Some(doc.sha256.clone());
                    sent_sha = Some(doc.sha256);
                    last_sent = Some(Instant::now());
                    force = false;
                    backoff.reset();
                }
                Err(ClientError::Unauthorized { message }) => return Err(agent.revoked(message)),
                Err(err) if err.is_transient() => {
                    let delay = backoff.next_delay_after(err.retry_after());
                    tracing::warn!(error = %err, retry_in = ?delay, "cannot send facts yet");
                    force = true;
                    tokio::time::sleep(delay).await;
                    continue;
                }
                Err(err) => {
                    tracing::error!(error = %err, sha256 = %doc.sha256, "the server refused the facts");
                    refused_sha = Some(doc.sha256);
                    force = false;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(agent.cfg.facts_interval) => refused_sha = None,
            () = agent.facts_wake.notified() => force = true,
        }
    }
}

/// Writes the node's GPU map for `doc` (the Slurm task prolog reads it); the facts' hash
/// when it was written, `None` (tried again at the next collection) when not.
async fn write_gpu_map(agent: &Arc<Agent>, doc: &facts_link::FactsDoc) -> Option<String> {
    let (cfg, facts, root) = (
        agent.cfg.node_env.clone(),
        doc.facts.clone(),
        agent.cfg.facts_root.clone(),
    );
    let written =
        tokio::task::spawn_blocking(move || super::node_env::write_gpu_map(&cfg, &facts, &root))
            .await;
    match written {
        Ok(Ok(map)) => {
            tracing::info!(gpus = map.gpus.len(), failed_plugins = ?map.failed_plugins, "GPU map written beside the node env file");
            Some(doc.sha256.clone())
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot write the GPU map; Slurm tasks compute it themselves");
            None
        }
        Err(error) => {
            tracing::warn!(%error, "the GPU map's computation failed; Slurm tasks compute it themselves");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn clock_offset_is_the_middle_of_the_round_trip() {
        // Sent at 1,000, answered at 1,400 (node clock); the server said 10,300.
        let c = super::clock_offset(1_000, 1_400, 10_300);
        assert_eq!((c.offset_ns, c.error_ns), (9_100, 200));
    }
}
