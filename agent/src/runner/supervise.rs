//! Parent side of a test child: spawn it, feed it its input, read its events, keep the
//! tail of its stderr, and end it on timeout, on request, or when it hangs.
//!
//! A hang is silence: no row and no progress event for the stall limit plus the slowest
//! step the child declared in its plan (`ChildEvent::Plan`). Ranks of one communicator
//! that disagree on a setting wait for each other forever without a word in any log, so
//! the silence is the only sign; the child is then killed (its GPUs are freed when its
//! process group exits) and the result says `hung` and where it stopped.
//!
//! The child leads its own process group, so a stop kills whatever it started too (an
//! `mpirun`, a `ib_write_bw`...), and it gets `SIGKILL` if the agent dies, so a crashed
//! agent leaves no orphan holding a GPU or a port. It starts from a cleared environment
//! (see [`child_env`]): the agent's secrets never reach it.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use heddle_types::jobs::{Outcome, Progress, ResultRow, ResultUpload};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio::time::Instant;

use super::child_env;
use super::protocol::{ChildEvent, ChildInput};
pub use super::stall::{HUNG_KEY, Hang, StallLimit};
use super::stall::{Pace, Plan, stage};

/// How much of the child's stderr the result keeps.
pub const STDERR_TAIL_BYTES: usize = 8 * 1024;
/// After the child exits, how long to wait for the rest of its output (a grandchild
/// holding the pipes open must not stall the job forever).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const MAX_LINE: usize = 1 << 20;

pub struct ChildSpec {
    /// The agent binary, normally; any program speaking the protocol will do.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub input: ChildInput,
    /// The job's variables, already checked against the policy. The child gets these on
    /// top of what [`child_env::inherited`] keeps of the agent's environment, and nothing
    /// else of it.
    pub env: BTreeMap<String, String>,
    pub timeout: Option<Duration>,
    /// When silence counts as a hang; `None` never.
    pub stall: Option<StallLimit>,
}

/// Why the parent ended a child early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The server asked for it; the outcome is `cancelled`.
    Cancelled,
    /// The lease went to someone else; nothing is uploaded.
    LeaseLost,
    /// The agent is shutting down or was revoked; nothing is uploaded.
    Shutdown,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ChildEnd {
    Exited(i32),
    Signaled(i32),
    TimedOut(Duration),
    /// Silent past its stall limit; killed.
    Hung(Hang),
    Stopped(StopReason),
    SpawnFailed(String),
    /// Nothing was started: the job breaks a rule the agent enforces itself.
    Refused(String),
}

#[derive(Debug, Clone)]
pub struct ChildReport {
    pub end: ChildEnd,
    pub stderr_tail: String,
    pub rows: Vec<ResultRow>,
    pub summary: serde_json::Map<String, serde_json::Value>,
    pub skipped: Option<String>,
    /// Stdout lines that were not protocol events (kept as a count, not dropped silently).
    pub unparsed_lines: usize,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
}

impl ChildReport {
    /// The report of a job that was refused before any process started.
    pub fn refused(why: String) -> ChildReport {
        let now = Utc::now();
        ChildReport {
            end: ChildEnd::Refused(why),
            stderr_tail: String::new(),
            rows: Vec::new(),
            summary: serde_json::Map::new(),
            skipped: None,
            unparsed_lines: 0,
            started_at: now,
            finished_at: now,
        }
    }

    pub fn outcome(&self) -> (Outcome, Option<String>, Option<i32>) {
        match &self.end {
            ChildEnd::Exited(0) => match &self.skipped {
                Some(reason) => (Outcome::Skipped, Some(reason.clone()), Some(0)),
                None => (Outcome::Succeeded, None, Some(0)),
            },
            ChildEnd::Exited(code) => {
                let reason = match last_line(&self.stderr_tail) {
                    Some(line) => format!("exited with status {code}: {line}"),
                    None => format!("exited with status {code}"),
                };
                (Outcome::Failed, Some(reason), Some(*code))
            }
            ChildEnd::Signaled(sig) => (
                Outcome::Failed,
                Some(format!("killed by signal {sig} ({})", signal_name(*sig))),
                None,
            ),
            ChildEnd::TimedOut(t) => (
                Outcome::Failed,
                Some(format!("timed out after {} s", t.as_secs())),
                None,
            ),
            ChildEnd::Hung(h) => (
                Outcome::Failed,
                Some(format!(
                    "hung: no row or progress for {} s (limit {} s) at {}; the test was killed \
                     and its GPUs freed",
                    h.silent_for.as_secs(),
                    h.limit.as_secs(),
                    h.stage
                )),
                None,
            ),
            ChildEnd::Stopped(StopReason::Cancelled) => {
                (Outcome::Cancelled, Some("cancelled".into()), None)
            }
            ChildEnd::Stopped(other) => {
                (Outcome::Failed, Some(format!("stopped: {other:?}")), None)
            }
            ChildEnd::SpawnFailed(err) => (
                Outcome::Failed,
                Some(format!("could not start the test process: {err}")),
                None,
            ),
            ChildEnd::Refused(why) => (Outcome::Failed, Some(why.clone()), None),
        }
    }

    pub fn into_upload(self, upload_key: String) -> ResultUpload {
        let (outcome, reason, exit_code) = self.outcome();
        let mut summary = self.summary;
        if let ChildEnd::Hung(h) = &self.end {
            summary.insert(
                HUNG_KEY.into(),
                serde_json::json!({
                    "stage": h.stage,
                    "silent_s": h.silent_for.as_secs(),
                    "limit_s": h.limit.as_secs(),
                    "last_size_bytes": h.last_size_bytes,
                }),
            );
        }
        if self.unparsed_lines > 0 {
            summary.insert("unparsed_stdout_lines".into(), self.unparsed_lines.into());
        }
        ResultUpload {
            upload_key,
            outcome,
            reason,
            exit_code,
            stderr_tail: (!self.stderr_tail.is_empty()).then_some(self.stderr_tail),
            summary: serde_json::Value::Object(summary),
            rows: self.rows,
            started_at: self.started_at,
            finished_at: self.finished_at,
            claim_id: None,
        }
    }
}

/// The moment silence becomes a hang, if the watch is on.
fn stall_deadline(
    limit: Option<StallLimit>,
    plan: Option<&Plan>,
    pace: &Pace,
    last_sign: Instant,
) -> Option<(Instant, Duration)> {
    let limit = limit?;
    if plan.is_none() && !limit.from_start {
        return None;
    }
    let allowance = plan.map_or(Duration::ZERO, |p| pace.step_allowance(p));
    let total = limit.beyond_slowest + allowance;
    Some((last_sign + total, total))
}

fn last_line(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(500).collect())
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "signal",
    }
}

/// The last `cap` bytes written to a stream.
#[derive(Debug)]
pub struct Tail {
    buf: VecDeque<u8>,
    cap: usize,
}

impl Tail {
    pub fn new(cap: usize) -> Self {
        Tail {
            buf: VecDeque::with_capacity(cap),
            cap,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(self.cap)..];
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.buf.extend(bytes);
    }

    /// Lossy UTF-8, without the replacement character a cut through a multi-byte
    /// character would leave at the start.
    pub fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(self.buf.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        let s = String::from_utf8_lossy(&v);
        s.trim_start_matches('\u{FFFD}').to_string()
    }
}

/// Kills the child's whole process group if the supervising future is dropped before
/// the child was reaped (agent shutdown, task abort).
struct GroupGuard(Option<i32>);

impl GroupGuard {
    fn kill(&self) {
        if let Some(pgid) = self.0 {
            // SAFETY: plain syscall; the group id is the child's pid, which cannot be
            // reused while the child is unreaped.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs the child to its end. `stop` ends it early; progress events are published on
/// `progress` for the lease renewals.
pub async fn supervise(
    spec: ChildSpec,
    mut stop: watch::Receiver<Option<StopReason>>,
    progress: watch::Sender<Option<Progress>>,
) -> ChildReport {
    let started_at = Utc::now();
    let mut report = ChildReport {
        end: ChildEnd::Exited(0),
        stderr_tail: String::new(),
        rows: Vec::new(),
        summary: serde_json::Map::new(),
        skipped: None,
        unparsed_lines: 0,
        started_at,
        finished_at: started_at,
    };
    if let Some(reason) = *stop.borrow() {
        report.end = ChildEnd::Stopped(reason);
        return report;
    }
    // Removed (with whatever the test left in it) when this function returns.
    let workdir = match private_workdir() {
        Ok(dir) => dir,
        Err(err) => {
            report.end = ChildEnd::SpawnFailed(format!(
                "could not create the test's private working directory: {err}"
            ));
            report.finished_at = Utc::now();
            return report;
        }
    };
    let mut child = match spawn(&spec, workdir.path()) {
        Ok(child) => child,
        Err(err) => {
            report.end = ChildEnd::SpawnFailed(err.to_string());
            report.finished_at = Utc::now();
            return report;
        }
    };
    let mut guard = GroupGuard(child.id().map(|p| p as i32));
    tracing::debug!(pid = ?child.id(), kind = %spec.input.kind, "test child started");

    if let Some(mut stdin) = child.stdin.take() {
        let input = serde_json::to_vec(&spec.input).expect("child input always serializes");
        // A child that exits without reading its input is reported by its exit status.
        let _ = stdin.write_all(&input).await;
    }
    let tail = Arc::new(Mutex::new(Tail::new(STDERR_TAIL_BYTES)));
    let stderr_task = child.stderr.take().map(|mut stderr| {
        let tail = tail.clone();
        tokio::spawn(async move {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                tail.lock().expect("tail lock").push(&chunk[..n]);
            }
        })
    });
    let mut lines = child.stdout.take().map(|s| BufReader::new(s).lines());

    let deadline = spec.timeout.map(|t| Instant::now() + t);
    let timeout = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    let mut stop_open = true;
    let mut plan: Option<Plan> = None;
    let mut pace = Pace::default();
    let mut last_sign = Instant::now();
    let end = loop {
        let stall = stall_deadline(spec.stall, plan.as_ref(), &pace, last_sign);
        tokio::select! {
            status = child.wait() => break exit_end(status),
            line = next_line(&mut lines), if lines.is_some() => match line {
                Some(line) => match handle_line(&line, &mut report, &progress) {
                    Sign::Life => {
                        last_sign = Instant::now();
                        if let Some(row) = report.rows.last() {
                            pace.row(row.size_bytes, last_sign.into_std());
                        }
                    }
                    Sign::Plan(p) => {
                        plan = Some(p);
                        last_sign = Instant::now();
                        pace.planned(last_sign.into_std());
                    }
                    Sign::None => {}
                },
                None => lines = None,
            },
            () = sleep_until_opt(stall.map(|(at, _)| at)) => {
                guard.kill();
                let _ = child.wait().await;
                let sizes = plan.as_ref().map(|p| p.sizes_bytes.as_slice()).unwrap_or_default();
                let (stage, last_size_bytes) = stage(sizes, &report.rows);
                let limit = stall.map(|(_, l)| l).unwrap_or_default();
                tracing::warn!(kind = %spec.input.kind, %stage, limit_s = limit.as_secs(), "test child hung; killed");
                break ChildEnd::Hung(Hang {
                    silent_for: last_sign.elapsed(),
                    limit,
                    stage,
                    last_size_bytes,
                });
            }
            () = &mut timeout => {
                guard.kill();
                let _ = child.wait().await;
                break ChildEnd::TimedOut(spec.timeout.unwrap_or_default());
            }
            changed = stop.changed(), if stop_open => {
                if changed.is_err() {
                    stop_open = false;
                    continue;
                }
                let reason = *stop.borrow_and_update();
                if let Some(reason) = reason {
                    guard.kill();
                    let _ = child.wait().await;
                    break ChildEnd::Stopped(reason);
                }
            }
        }
    };
    // The child is reaped: its pid (and group id) may be reused from now on.
    guard.0 = None;

    let drain_until = Instant::now() + DRAIN_GRACE;
    while lines.is_some() {
        match tokio::time::timeout_at(drain_until, next_line(&mut lines)).await {
            Ok(Some(line)) => {
                handle_line(&line, &mut report, &progress);
            }
            Ok(None) => lines = None,
            Err(_) => {
                tracing::warn!("test child's output stayed open after it exited; not waiting");
                break;
            }
        }
    }
    if let Some(task) = stderr_task {
        let abort = task.abort_handle();
        if tokio::time::timeout_at(drain_until, task).await.is_err() {
            abort.abort();
        }
    }
    report.stderr_tail = tail.lock().expect("tail lock").text();
    report.end = end;
    report.finished_at = Utc::now();
    report
}

/// A fresh directory of the test's own (mode 0700, under the agent's temporary directory):
/// its working directory, `HOME` and `TMPDIR`. What a test writes by default (NCCL's debug
/// log, a UCX profile) lands there, and what UCX reads from `./ucx.conf` and
/// `$HOME/ucx.conf` cannot be planted by anyone else.
fn private_workdir() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("heddle-test-").tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

fn spawn(spec: &ChildSpec, workdir: &std::path::Path) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(child_env::inherited())
        .envs(&spec.env)
        .env("HOME", workdir)
        .env("TMPDIR", workdir)
        .current_dir(workdir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    // SAFETY: `getpid`, `prctl` and `getppid` are async-signal-safe, as required between
    // fork and exec.
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the death signal was armed.
            if libc::getppid() != parent {
                return Err(std::io::Error::other(
                    "agent exited while starting the test",
                ));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut Option<tokio::io::Lines<R>>,
) -> Option<String> {
    match lines {
        Some(l) => l.next_line().await.ok().flatten(),
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a line says about the child's liveness.
enum Sign {
    /// A row or a progress event: it is moving.
    Life,
    Plan(Plan),
    None,
}

fn handle_line(
    line: &str,
    report: &mut ChildReport,
    progress: &watch::Sender<Option<Progress>>,
) -> Sign {
    if line.len() > MAX_LINE {
        report.unparsed_lines += 1;
        return Sign::None;
    }
    match serde_json::from_str::<ChildEvent>(line) {
        Ok(ChildEvent::Progress(p)) => {
            progress.send_replace(Some(p));
            Sign::Life
        }
        Ok(ChildEvent::Row { row }) => {
            report.rows.push(row);
            Sign::Life
        }
        Ok(ChildEvent::Summary { summary }) => {
            report.summary.extend(summary);
            Sign::None
        }
        Ok(ChildEvent::Skipped { reason }) => {
            report.skipped = Some(reason);
            Sign::None
        }
        Ok(ChildEvent::Plan {
            sizes_bytes,
            slowest_step_s,
        }) => Sign::Plan(Plan {
            sizes_bytes,
            // A hostile or broken value must not disarm the watch nor overflow it.
            slowest_step: Duration::from_secs_f64(if slowest_step_s.is_finite() {
                slowest_step_s.clamp(0.0, 86_400.0)
            } else {
                0.0
            }),
        }),
        Err(err) => {
            tracing::debug!(%err, line, "test child wrote a line that is not an event");
            report.unparsed_lines += 1;
            Sign::None
        }
    }
}

fn exit_end(status: std::io::Result<std::process::ExitStatus>) -> ChildEnd {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => ChildEnd::Exited(code),
            (None, Some(sig)) => ChildEnd::Signaled(sig),
            (None, None) => ChildEnd::Exited(-1),
        },
        Err(err) => ChildEnd::SpawnFailed(format!("waiting for the child failed: {err}")),
    }
}

#[cfg(test)]
#[path = "supervise_tests.rs"]
mod tests;
