//! Uploading results, oldest first, until the server has acknowledged each: those in the
//! spool, then those held in memory because the disk refused them (`held.rs`).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Agent, Backoff, LifecycleError};
use crate::client::{ClientError, UploadOutcome};
use crate::spool::{SpoolEntry, SpoolError, SpoolId};

/// Even without a wake-up the spool is looked at this often, in case a wake-up was missed.
const RESCAN: Duration = Duration::from_secs(60);

/// Drains the spool whenever something is spooled. `drained` turns true after the first
/// complete drain.
pub(super) async fn run(
    agent: Arc<Agent>,
    drained: watch::Sender<bool>,
) -> Result<Infallible, LifecycleError> {
    loop {
        drain(&agent).await?;
        drained.send_replace(true);
        tokio::select! {
            () = agent.upload_wake.notified() => {}
            () = tokio::time::sleep(RESCAN) => {}
        }
    }
}

/// The server's last word on one upload.
enum Answer {
    /// Stored, or impossible to store (409, 404): let go of the result.
    Definitive,
    /// Refused for good otherwise: keep it aside, never send it again.
    Refused(String),
}

/// Uploads every spooled and held result; returns once none is left. An entry is removed
/// only on a definitive answer: stored (201/200), or impossible to store (409, 404).
/// Other refusals move it aside (`spool/rejected/`) so one bad entry cannot block the
/// rest; network and server errors are retried with backoff, in order. Held results are
/// first offered to the spool again; those it still refuses are uploaded from memory.
pub(super) async fn drain(agent: &Agent) -> Result<(), LifecycleError> {
    let spool = &agent.spool;
    let mut backoff = Backoff::new(Duration::from_millis(500), agent.cfg.backoff_cap);
    // Acknowledged entries whose file could not be removed (a read-only disk): not sent
    // again in this drain, and removed by a later one.
    let mut acked: BTreeSet<SpoolId> = BTreeSet::new();
    loop {
        if !agent.held.is_empty() {
            let (_, err) = agent.held.spool_to(spool);
            if let Some(err) = err {
                tracing::debug!(error = %err, held = agent.held.len(), "the spool still refuses writes");
            }
        }
        let ids = match spool.list() {
            Ok(ids) => ids,
            Err(err) if !agent.held.is_empty() => {
                tracing::error!(error = %err, "cannot read the spool; uploading the results held in memory");
                Vec::new()
            }
            Err(err) => {
                let delay = backoff.next_delay();
                tracing::error!(error = %err, retry_in = ?delay, "cannot read the spool");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        let mut pending = Vec::new();
        for id in ids {
            if acked.contains(&id) {
                if spool.ack(&id).is_ok() {
                    acked.remove(&id);
                }
            } else {
                pending.push(id);
            }
        }
        if pending.is_empty() && agent.held.is_empty() {
            return Ok(());
        }
        for id in pending {
            let entry = match spool.read(&id) {
                Ok(entry) => entry,
                Err(err @ SpoolError::Corrupt { .. }) => {
                    tracing::error!(error = %err, "spool entry is unreadable; moving it aside");
                    if let Err(e) = spool.reject(&id, &err.to_string()) {
                        tracing::error!(error = %e, "cannot move the entry aside");
                    }
                    continue;
                }
                Err(err) => {
                    tracing::error!(error = %err, "cannot read a spool entry");
                    tokio::time::sleep(backoff.next_delay()).await;
                    break;
                }
            };
            let job_id = entry.job_id;
            match upload(agent, &entry, &mut backoff, "it stays spooled").await? {
                Answer::Definitive => {
                    if let Err(err) = spool.ack(&id) {
                        tracing::error!(%job_id, error = %err, "cannot remove an acknowledged result; it will be removed later, or re-sent under the same key after a restart");
                        acked.insert(id);
                    }
                }
                Answer::Refused(why) => {
                    if let Err(e) = spool.reject(&id, &why) {
                        tracing::error!(error = %e, "cannot move the entry aside");
                    }
                }
            }
        }
        // At most one held result per round: the disk may take the rest meanwhile.
        if let Some(entry) = agent.held.front() {
            let answer = upload(agent, &entry, &mut backoff, "it stays in memory").await?;
            if let Answer::Refused(why) = answer {
                tracing::error!(job_id = %entry.job_id, upload_key = %entry.upload.upload_key, %why,
                    "dropping a refused result held in memory: the disk has no room to keep it aside");
            }
            agent.held.remove(&entry.upload.upload_key);
        }
    }
}

/// Sends one result until the server gives a definitive answer; retries network and
/// server errors with `backoff`, sooner when a heartbeat finds the server back.
async fn upload(
    agent: &Agent,
    entry: &SpoolEntry,
    backoff: &mut Backoff,
    meanwhile: &str,
) -> Result<Answer, LifecycleError> {
    let job_id = entry.job_id;
    let key = entry.upload.upload_key.as_str();
    let answer = loop {
        match agent.client.upload_result(job_id, &entry.upload).await {
            Ok(UploadOutcome::Stored(accepted)) => {
                if accepted.created {
                    tracing::info!(%job_id, upload_key = key, result_id = %accepted.result_id, "result uploaded");
                } else {
                    tracing::info!(%job_id, upload_key = key, result_id = %accepted.result_id, "result was already stored (retry)");
                }
                break Answer::Definitive;
            }
            Ok(UploadOutcome::Conflict(message)) => {
                // The job holds another result, or was claimed again since this one
                // ran (a stale claim): either way the server's copy stands.
                tracing::warn!(%job_id, upload_key = key, %message, "the server will not store this result; dropping it");
                break Answer::Definitive;
            }
            Ok(UploadOutcome::UnknownJob(message)) => {
                tracing::warn!(%job_id, upload_key = key, %message, "server does not know the job; dropping its result");
                break Answer::Definitive;
            }
            Err(ClientError::Unauthorized { message }) => {
                return Err(agent.revoked(message));
            }
            Err(err) if err.is_transient() || matches!(err, ClientError::Decode { .. }) => {
                let delay = backoff.next_delay_after(err.retry_after());
                tracing::warn!(%job_id, error = %err, retry_in = ?delay, failures = backoff.failures(),
                    "result upload failed; {meanwhile}");
                // Or sooner, when a heartbeat finds the server back.
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = agent.server_back.notified() => backoff.reset(),
                }
            }
            Err(err) => {
                tracing::error!(%job_id, upload_key = key, error = %err, "server refused the result for good");
                break Answer::Refused(err.to_string());
            }
        }
    };
    backoff.reset();
    Ok(answer)
}
