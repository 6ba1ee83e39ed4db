//! Claiming jobs and seeing each through: child process, lease renewals, cancellation,
//! and a spooled result.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use heddle_types::agent::{JobLease, LeaseRenew};
use heddle_types::env_policy;
use heddle_types::jobs::Progress;
use heddle_types::kinds::SpecParamsError;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use uuid::Uuid;

use super::{Agent, Backoff, LifecycleError};
use crate::client::{ClientError, RenewOutcome};
use crate::runner::protocol::{ChildInput, RendezvousAccess};
use crate::runner::supervise::{
    ChildEnd, ChildReport, ChildSpec, StallLimit, StopReason, supervise,
};
use crate::runner::{self};
use crate::spool::SpoolEntry;

/// The server refuses progress messages longer than this.
const MAX_PROGRESS_MESSAGE: usize = 1024;

/// Claims jobs while a slot is free. Waits for the first spool drain so results from
/// before a restart reach the server before new work starts.
pub(super) async fn claim_loop(
    agent: Arc<Agent>,
    mut drained: watch::Receiver<bool>,
) -> Result<Infallible, LifecycleError> {
    if drained.wait_for(|d| *d).await.is_err() {
        return std::future::pending().await;
    }
    let slots = Arc::new(Semaphore::new(agent.cfg.max_parallel as usize));
    let mut backoff = Backoff::new(Duration::from_secs(1), agent.cfg.backoff_cap);
    loop {
        agent.held.wait_for_room().await;
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        match agent.client.claim().await {
            Ok(Some(lease)) => {
                backoff.reset();
                tracing::info!(job_id = %lease.job_id, run_id = %lease.run_id, kind = %lease.spec.kind,
                    attempt = lease.attempt, rank = lease.rank, world_size = lease.world_size, "job claimed");
                let (stop, check) = agent.register_job(lease.job_id);
                tokio::spawn(run_job(agent.clone(), lease, stop, check, permit));
            }
            Ok(None) => {
                backoff.reset();
                drop(permit);
                tokio::time::sleep(agent.cfg.claim_interval).await;
            }
            Err(ClientError::Unauthorized { message }) => return Err(agent.revoked(message)),
            Err(err) => {
                drop(permit);
                let delay = backoff.next_delay_after(err.retry_after());
                tracing::warn!(error = %err, retry_in = ?delay, failures = backoff.failures(), "cannot claim jobs");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = agent.server_back.notified() => backoff.reset(),
                }
            }
        }
    }
}

/// What a multi-node test needs to meet its peers through the server: the replicas and
/// this agent's credential. It goes to the child in its input on stdin, never in its
/// environment.
fn rendezvous_access(agent: &Agent) -> Option<RendezvousAccess> {
    agent.client.credential().map(|credential| {
        let tls = agent.client.tls();
        RendezvousAccess {
            servers: agent.client.servers().to_vec(),
            credential,
            ca_file: tls.ca_file.clone(),
            pins: tls.pins.iter().map(|p| p.to_string()).collect(),
            scope: None,
        }
    })
}

/// Why the job may not run at all: params its kind's type refuses (decoded when the lease
/// was read), or a variable of its env (or a sweep cell's) that the policy refuses. The
/// server refuses such jobs too; this holds for a job that reached the database some other
/// way, or a server whose limits differ from this agent's. A kind this agent does not know
/// is not refused here: it fails as unsupported.
fn refusal(lease: &JobLease) -> Option<String> {
    if let Err(SpecParamsError::Param(e)) = lease.spec.params.typed() {
        return Some(format!("the job's params are refused: {e}"));
    }
    if let Err(e) = env_policy::check_env(&lease.spec.env) {
        return Some(format!("the job's environment is refused: {e}"));
    }
    // Again here, with what the agent itself passes on, so an environment too large to
    // `execve` is refused with its sources rather than failing every test with E2BIG.
    let inherited = crate::runner::child_env::inherited();
    let own: Vec<(String, String)> = inherited
        .iter()
        .filter(|(k, _)| !lease.spec.env.contains_key(&*k.to_string_lossy()))
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let sources = format!(
        "the job's env (run, profiles, recommendations): {}, the agent's own: {}",
        lease.spec.env.len(),
        own.len()
    );
    let all = lease
        .spec
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(own.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Err(e) = env_policy::check_env_size(all, &sources) {
        return Some(format!("the job's environment is refused: {e}"));
    }
    let grid = lease.spec.params.get("grid").and_then(|g| g.as_object());
    for name in grid.into_iter().flat_map(|g| g.keys()) {
        if let Err(e) = env_policy::check_name(name) {
            return Some(format!("the sweep grid is refused: {e}"));
        }
    }
    None
}

async fn run_job(
    agent: Arc<Agent>,
    lease: JobLease,
    stop: watch::Receiver<Option<StopReason>>,
    check: Arc<Notify>,
    _slot: OwnedSemaphorePermit,
) {
    let job_id = lease.job_id;
    let known_kind = runner::find(&lease.spec.kind).is_some();
    let refused = refusal(&lease);
    let report = if !known_kind {
        unsupported(&lease.spec.kind)
    } else if let Some(why) = refused {
        tracing::warn!(%job_id, %why, "job refused; nothing runs");
        ChildReport::refused(why)
    } else {
        let spec = ChildSpec {
            program: agent.cfg.child_program.clone(),
            args: vec!["child".into()],
            input: ChildInput {
                kind: lease.spec.kind.clone(),
                params: lease.spec.params.raw().clone(),
                job_id,
                run_id: lease.run_id,
                rank: lease.rank,
                world_size: lease.world_size,
                rendezvous: rendezvous_access(&agent),
            },
            env: lease.spec.env.clone(),
            // Every job ends: a run without its own limit gets the agent's.
            timeout: Some(
                lease
                    .spec
                    .timeout_s
                    .map_or(agent.cfg.job_timeout, |s| Duration::from_secs(u64::from(s))),
            ),
            stall: Some(stall_limit(agent.cfg.stall_limit, lease.spec.stall_s)),
        };
        let (progress_tx, progress_rx) = watch::channel(None);
        tokio::select! {
            report = supervise(spec, stop, progress_tx) => report,
            never = renew_loop(&agent, &lease, progress_rx, check) => match never {},
        }
    };
    match report.end {
        ChildEnd::Stopped(StopReason::LeaseLost) => {
            tracing::warn!(%job_id, "lease lost (job requeued or given to another agent); its result is dropped");
            agent.unregister_job(job_id);
            return;
        }
        ChildEnd::Stopped(StopReason::Shutdown) => {
            tracing::info!(%job_id, "job abandoned at shutdown");
            agent.unregister_job(job_id);
            return;
        }
        _ => {}
    }
    let mut upload = report.into_upload(Uuid::new_v4().to_string());
    // Spooled with the result, so a retry after a restart still names the claim it ran under.
    upload.claim_id = Some(lease.claim_id);
    if !known_kind {
        upload.exit_code = None; // no child ran
    }
    tracing::info!(%job_id, outcome = ?upload.outcome, reason = upload.reason.as_deref().unwrap_or(""),
        rows = upload.rows.len(), "job finished");
    let entry = SpoolEntry {
        job_id,
        run_id: lease.run_id,
        spooled_at: Utc::now(),
        upload,
    };
    let spool = agent.spool.clone();
    let to_write = entry.clone();
    let written = tokio::task::spawn_blocking(move || spool.write(&to_write)).await;
    // Only now, with the result durable, does the job stop counting as running.
    agent.unregister_job(job_id);
    match written {
        Ok(Ok(id)) => {
            tracing::debug!(%job_id, spool_entry = %id, "result spooled");
        }
        Ok(Err(err)) => {
            let held = agent.held.push(entry);
            tracing::error!(%job_id, error = %err, held,
                "cannot spool the result (disk full or read-only?); keeping it in memory and uploading it from there until the disk takes it");
        }
        Err(err) => {
            let held = agent.held.push(entry);
            tracing::error!(%job_id, error = %err, held,
                "spool write panicked; keeping the result in memory and uploading it from there");
        }
    }
    agent.upload_wake.notify_one();
}

fn unsupported(kind: &str) -> ChildReport {
    let now = Utc::now();
    ChildReport {
        end: ChildEnd::Exited(0),
        stderr_tail: String::new(),
        rows: Vec::new(),
        summary: Default::default(),
        skipped: Some(format!("unsupported job kind: {kind}")),
        unparsed_lines: 0,
        started_at: now,
        finished_at: now,
    }
}

/// The stall watch of a job: the run's `stall_s` watches from the start; the agent's
/// default arms once the test declares its plan (kinds that can wait on a peer do).
fn stall_limit(default: Duration, run: Option<u32>) -> StallLimit {
    match run {
        Some(s) => StallLimit {
            beyond_slowest: Duration::from_secs(u64::from(s)),
            from_start: true,
        },
        None => StallLimit {
            beyond_slowest: default,
            from_start: false,
        },
    }
}

/// What is left of a lease, judged on the agent's monotonic clock from the term the server
/// gave (`lease_s`, counted from when the request went out, so never longer than the
/// server's). Only an older server's answer, without a term, is judged by its absolute
/// expiry against this node's wall clock, which may be minutes off the server's.
#[derive(Debug, Clone, Copy)]
struct LeaseTerm {
    until: Option<Instant>,
    /// The whole term granted.
    term: Option<Duration>,
    expires: chrono::DateTime<Utc>,
}

impl LeaseTerm {
    fn new(lease_s: Option<f64>, expires: chrono::DateTime<Utc>, sent: Instant) -> LeaseTerm {
        let term = lease_s
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(86_400.0)));
        LeaseTerm {
            until: term.map(|t| sent + t),
            term,
            expires,
        }
    }

    /// How long one replica may take to answer a renewal: a third of the term (at least a
    /// second), so a hanging replica leaves time to ask the others before it lapses.
    fn per_replica(&self) -> Option<Duration> {
        self.term
            .map(|t| (t / 3).clamp(Duration::from_secs(1), Duration::from_secs(10)))
    }

    fn left(&self, now: Instant, wall_now: chrono::DateTime<Utc>) -> Option<Duration> {
        match self.until {
            Some(until) => Some(until.saturating_duration_since(now)),
            None => (self.expires - wall_now).to_std().ok(),
        }
    }
}

/// How long to wait between renewals: a third of the lease (so two can fail before it
/// lapses), no more than half a heartbeat, no less than a quarter second.
pub(crate) fn renew_every(heartbeat: Duration, lease_left: Option<Duration>) -> Duration {
    let by_lease = lease_left.map_or(heartbeat / 2, |left| left / 3);
    by_lease
        .min(heartbeat / 2)
        .clamp(Duration::from_millis(250), Duration::from_secs(30))
}

/// Renews the lease (the first renewal marks the job running) with the child's latest
/// progress, and turns the server's answers into stop requests. Never returns: the job
/// ends when the child does.
async fn renew_loop(
    agent: &Agent,
    lease: &JobLease,
    mut progress: watch::Receiver<Option<Progress>>,
    check: Arc<Notify>,
) -> Infallible {
    let job_id = lease.job_id;
    let mut term = LeaseTerm::new(lease.lease_s, lease.lease_expires_at, Instant::now());
    let mut failures = 0u32;
    // After a failed renewal: sooner than the usual cadence, but with backoff and never
    // sooner than the server asks (while its database is down it answers 503 with
    // Retry-After, and the lease is not judged on that time: the child keeps running).
    let mut backoff = Backoff::new(Duration::from_secs(1), agent.cfg.backoff_cap);
    let mut retry_in = Duration::ZERO;
    let mut first = true;
    loop {
        if !first {
            let left = term.left(Instant::now(), Utc::now());
            let mut wait = renew_every(agent.heartbeat_interval(), left);
            if failures > 0 {
                wait = wait.min(retry_in);
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = check.notified() => {}
            }
        }
        first = false;
        let req = LeaseRenew {
            progress: progress.borrow_and_update().clone().map(sanitize),
            claim_id: Some(lease.claim_id),
        };
        let sent = Instant::now();
        match agent.client.renew(job_id, &req, term.per_replica()).await {
            Ok(RenewOutcome::Renewed(r)) => {
                failures = 0;
                backoff.reset();
                term = LeaseTerm::new(r.lease_s, r.lease_expires_at, sent);
                if r.cancel {
                    tracing::info!(%job_id, "job cancelled by the server; stopping its child");
                    agent.stop_job(job_id, StopReason::Cancelled);
                    break;
                }
            }
            Ok(RenewOutcome::LeaseLost(message)) => {
                tracing::warn!(%job_id, %message, "lease lost; stopping the child");
                agent.stop_job(job_id, StopReason::LeaseLost);
                break;
            }
            Err(ClientError::Unauthorized { message }) => {
                agent.stop_job(job_id, StopReason::Shutdown);
                agent.fatal(agent.revoked(message));
                break;
            }
            Err(ClientError::Rejected {
                status: 404,
                message,
                ..
            }) => {
                tracing::warn!(%job_id, %message, "the server no longer knows this job; stopping the child");
                agent.stop_job(job_id, StopReason::LeaseLost);
                break;
            }
            Err(err) => {
                failures += 1;
                retry_in = backoff.next_delay_after(err.retry_after());
                tracing::warn!(%job_id, error = %err, failures, retry_in = ?retry_in, "lease renewal failed; the child keeps running");
            }
        }
    }
    std::future::pending().await
}

fn sanitize(mut p: Progress) -> Progress {
    if p.message.len() > MAX_PROGRESS_MESSAGE {
        let mut cut = MAX_PROGRESS_MESSAGE;
        while !p.message.is_char_boundary(cut) {
            cut -= 1;
        }
        p.message.truncate(cut);
    }
    p.fraction = p
        .fraction
        .filter(|f| f.is_finite())
        .map(|f| f.clamp(0.0, 1.0));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(spec: &str) -> JobLease {
        serde_json::from_value(serde_json::json!({
            "job_id": Uuid::nil(), "claim_id": Uuid::nil(), "run_id": Uuid::nil(),
            "spec": serde_json::from_str::<serde_json::Value>(spec).unwrap(),
            "rank": 0, "world_size": 1, "attempt": 1,
            "lease_expires_at": "2026-11-28T00:00:00Z",
        }))
        .unwrap()
    }

    #[test]
    fn a_lease_whose_params_its_kind_refuses_is_refused_before_anything_runs() {
        let bad = lease(r#"{"kind":"nccl","params":{"gpus":"all"}}"#);
        let why = refusal(&bad).unwrap();
        assert!(why.contains("params.gpus"), "{why}");
        assert!(refusal(&lease(r#"{"kind":"nccl","params":{"gpus":2}}"#)).is_none());
        // A kind this agent does not know is read, and fails as unsupported instead.
        assert!(refusal(&lease(r#"{"kind":"from-the-future","params":{"x":1}}"#)).is_none());
    }

    #[test]
    fn renewal_cadence() {
        let hb = Duration::from_secs(10);
        assert_eq!(
            renew_every(hb, Some(Duration::from_secs(15))),
            Duration::from_secs(5)
        );
        assert_eq!(
            renew_every(hb, Some(Duration::from_secs(6))),
            Duration::from_secs(2)
        );
        assert_eq!(renew_every(hb, None), Duration::from_secs(5));
        assert_eq!(
            renew_every(hb, Some(Duration::ZERO)),
            Duration::from_millis(250)
        );
        assert_eq!(
            renew_every(Duration::from_secs(600), Some(Duration::from_secs(900))),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn a_lease_is_judged_on_the_agent_s_own_clock_whatever_its_wall_clock_says() {
        let sent = Instant::now();
        // The server's clock; the node's is ten minutes ahead of it, or behind.
        let server_now = Utc::now();
        let expires = server_now + chrono::Duration::seconds(15);
        let term = LeaseTerm::new(Some(15.0), expires, sent);
        let later = sent + Duration::from_secs(5);
        for skew in [-600, 0, 600] {
            let wall = server_now + chrono::Duration::seconds(5 + skew);
            assert_eq!(
                term.left(later, wall),
                Some(Duration::from_secs(10)),
                "skew {skew} s"
            );
        }
        assert_eq!(
            term.left(sent + Duration::from_secs(20), server_now),
            Some(Duration::ZERO)
        );
        // Without a term (an older server) the wall clock is all there is.
        let old = LeaseTerm::new(None, expires, sent);
        assert_eq!(
            old.left(later, server_now + chrono::Duration::seconds(600)),
            None
        );
        assert_eq!(old.left(later, server_now), Some(Duration::from_secs(15)));
    }

    #[test]
    fn progress_is_made_acceptable() {
        let p = sanitize(Progress {
            fraction: Some(1.7),
            message: "é".repeat(600),
        });
        assert_eq!(p.fraction, Some(1.0));
        assert!(p.message.len() <= MAX_PROGRESS_MESSAGE);
        assert!(p.message.chars().all(|c| c == 'é'));
        assert_eq!(
            sanitize(Progress {
                fraction: Some(f64::NAN),
                message: "x".into()
            })
            .fraction,
            None
        );
    }

    #[test]
    fn a_refused_env_fails_the_job_without_a_child() {
        let up = ChildReport::refused("the job's environment is refused: PATH ...".into())
            .into_upload("k".into());
        assert_eq!(up.outcome, heddle_types::jobs::Outcome::Failed);
        assert_eq!(up.exit_code, None);
        assert!(up.reason.unwrap().contains("PATH"));
    }

    #[test]
    fn unknown_kind_is_skipped_with_the_reason() {
        let up = unsupported("quantum-entangle").into_upload("k".into());
        assert_eq!(up.outcome, heddle_types::jobs::Outcome::Skipped);
        assert_eq!(
            up.reason.as_deref(),
            Some("unsupported job kind: quantum-entangle")
        );
    }
}
