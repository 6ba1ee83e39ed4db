//! Uploading spooled results, oldest first, until the server has acknowledged each.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Agent, Backoff, LifecycleError};
use crate::client::{ClientError, UploadOutcome};
use crate::spool::SpoolError;

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

/// Uploads every spooled result; returns once the spool is empty. An entry is removed
/// only on a definitive answer: stored (201/200), or impossible to store (409, 404).
/// Other refusals move it aside (`spool/rejected/`) so one bad entry cannot block the
/// rest; network and server errors are retried with backoff, in order.
pub(super) async fn drain(agent: &Agent) -> Result<(), LifecycleError> {
    let spool = &agent.spool;
    let mut backoff = Backoff::new(Duration::from_millis(500), agent.cfg.backoff_cap);
    loop {
        let ids = match spool.list() {
            Ok(ids) => ids,
            Err(err) => {
                let delay = backoff.next_delay();
                tracing::error!(error = %err, retry_in = ?delay, "cannot read the spool");
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        if ids.is_empty() {
            return Ok(());
        }
        for id in ids {
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
            let key = entry.upload.upload_key.as_str();
            let definitive = loop {
                match agent.client.upload_result(job_id, &entry.upload).await {
                    Ok(UploadOutcome::Stored(accepted)) => {
                        if accepted.created {
                            tracing::info!(%job_id, upload_key = key, result_id = %accepted.result_id, "result uploaded");
                        } else {
                            tracing::info!(%job_id, upload_key = key, result_id = %accepted.result_id, "result was already stored (retry)");
                        }
                        break true;
                    }
                    Ok(UploadOutcome::Conflict(message)) => {
                        // The job holds another result, or was claimed again since this one
                        // ran (a stale claim): either way the server's copy stands.
                        tracing::warn!(%job_id, upload_key = key, %message, "the server will not store this result; dropping it");
                        break true;
                    }
                    Ok(UploadOutcome::UnknownJob(message)) => {
                        tracing::warn!(%job_id, upload_key = key, %message, "server does not know the job; dropping its result");
                        break true;
                    }
                    Err(ClientError::Unauthorized { message }) => {
                        return Err(agent.revoked(message));
                    }
                    Err(err) if err.is_transient() || matches!(err, ClientError::Decode { .. }) => {
                        let delay = backoff.next_delay_after(err.retry_after());
                        tracing::warn!(%job_id, error = %err, retry_in = ?delay, failures = backoff.failures(),
                            "result upload failed; it stays spooled");
                        // Or sooner, when a heartbeat finds the server back.
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = agent.server_back.notified() => backoff.reset(),
                        }
                    }
                    Err(err) => {
                        tracing::error!(%job_id, upload_key = key, error = %err, "server refused the result; moving it aside");
                        if let Err(e) = spool.reject(&id, &err.to_string()) {
                            tracing::error!(error = %e, "cannot move the entry aside");
                        }
                        break false;
                    }
                }
            };
            backoff.reset();
            if definitive && let Err(err) = spool.ack(&id) {
                tracing::error!(%job_id, error = %err, "cannot remove an acknowledged result; it will be re-sent under the same key");
            }
        }
    }
}
