//! `heddle slurm prolog`: pre-flight as a Slurm `Prolog`, and the job's node list for
//! `heddle preflight` inside a Slurm job.
//!
//! slurmd runs the `Prolog` as root on each node of a job before it starts (at allocation
//! with `PrologFlags=Alloc`); a prolog that exits non-zero makes Slurm requeue the job
//! (and hold it, unless `SchedulerParameters=nohold_on_prolog_fail`) and drain the node.
//! So this command exits non-zero only for a node whose verdict is FAIL and only with
//! `--drain`, after draining it with Heddle's reason; anything else, a server that does
//! not answer within `--timeout` included, lets the job start, and is counted. What a job
//! should know (a WARN, a FAIL left in service, a job that started unchecked) is left as a
//! note that the task prolog prints into the job's output (`heddle_types::slurm`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use heddle_types::health::{PreflightCheck, PreflightRequest, PreflightResponse, Verdict};
use heddle_types::slurm;

use crate::args::NodeList;
use crate::client::{Client, ClientError};
use crate::exit::UsageError;

#[derive(clap::Subcommand)]
pub enum SlurmCmd {
    /// Slurm `Prolog`: pre-flight for this node (`SLURMD_NODENAME`; all of
    /// `SLURM_JOB_NODELIST` as a `PrologSlurmctld`). Exits 1 only for a FAIL with
    /// `--drain`; otherwise 0, also when the server cannot answer (docs/jobs.md).
    Prolog(PrologArgs),
}

#[derive(clap::Args)]
pub struct PrologArgs {
    /// Drain a node whose verdict is FAIL (`scontrol update nodename=NODE state=drain
    /// reason="heddle: ..."`) and exit 1, so that Slurm requeues the job onto other nodes.
    /// Without it a FAIL is a line in the job's output and the job runs.
    #[arg(long, env = "HEDDLE_SLURM_DRAIN")]
    drain: bool,
    /// How long pre-flight may take; past it the job starts unchecked (and it is counted).
    #[arg(long, env = "HEDDLE_SLURM_PREFLIGHT_TIMEOUT", default_value = "10s",
          value_parser = heddle_types::duration::parse)]
    timeout: Duration,
    /// nccl, memcpy, rdma or p2p (server default nccl). Only verdicts already held count:
    /// a job never waits for a check run.
    #[arg(long, env = "HEDDLE_SLURM_PREFLIGHT_CHECK", value_parser = |s: &str| s.parse::<PreflightCheck>())]
    check: Option<PreflightCheck>,
    /// Verdicts older than this are stale (server default 1h).
    #[arg(long, env = "HEDDLE_SLURM_PREFLIGHT_MAX_AGE", value_parser = crate::args::seconds)]
    max_age: Option<u32>,
    /// Where the notes for the job's tasks and the counts are kept (readable by every job's
    /// user; the task prolog reads the notes from the same place).
    #[arg(long, env = "HEDDLE_SLURM_DIR", default_value = slurm::DEFAULT_DIR)]
    dir: PathBuf,
    /// The `scontrol` that drains nodes.
    #[arg(long, env = "HEDDLE_SCONTROL", default_value = "scontrol")]
    scontrol: PathBuf,
}

/// The nodes of the Slurm job this runs in, for `heddle preflight` without `--nodes`.
pub fn job_nodes() -> Result<Vec<NodeList>, UsageError> {
    let list = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .ok_or_else(|| {
            UsageError("give --nodes (SLURM_JOB_NODELIST is not set: not in a Slurm job)".into())
        })?;
    crate::args::hostlist(list.trim())
        .map(|l| vec![l])
        .map_err(|e| UsageError(format!("SLURM_JOB_NODELIST: {e}")))
}

pub async fn run(cmd: SlurmCmd, client: anyhow::Result<Client>) -> ExitCode {
    match cmd {
        SlurmCmd::Prolog(args) => {
            // A panic would exit non-zero, and Slurm would drain the node for it.
            match tokio::spawn(prolog(args, client)).await {
                Ok(code) => code,
                Err(_) => {
                    eprintln!("heddle slurm prolog: internal error; the job starts unchecked");
                    ExitCode::SUCCESS
                }
            }
        }
    }
}

/// Lines for the job's output, written when the prolog ends (none: no file).
struct Notes {
    path: Option<PathBuf>,
    lines: Vec<String>,
}

impl Notes {
    fn add(&mut self, text: String) {
        eprintln!("heddle slurm prolog: {text}");
        self.lines.push(slurm::note_line(&text));
    }

    /// Replaces the job's notes file (a requeued job starts with none) atomically.
    fn write(self, dir: &Path) {
        let Some(path) = self.path else { return };
        if self.lines.is_empty() {
            let _ = std::fs::remove_file(&path);
            return;
        }
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)?;
            let mut text = String::new();
            for l in &self.lines {
                text.push_str(l);
                text.push('\n');
            }
            crate::files::write_atomic(&path, text.as_bytes(), 0o644)
        };
        if let Err(e) = write() {
            eprintln!("heddle slurm prolog: cannot write {}: {e}", path.display());
        }
    }
}

async fn prolog(args: PrologArgs, client: anyhow::Result<Client>) -> ExitCode {
    let job = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|j| slurm::job_id(&j).map(str::to_string));
    let mut notes = Notes {
        path: job.as_ref().map(|j| args.dir.join(slurm::notes_file(j))),
        lines: Vec::new(),
    };
    let outcome = ask(&args, client).await;
    let code = match outcome {
        Ok(answer) => decide(&args, &answer, &mut notes),
        Err((counter, why)) => {
            count(&args.dir, counter);
            notes.add(format!(
                "heddle: pre-flight did not run ({why}); the job starts unchecked"
            ));
            ExitCode::SUCCESS
        }
    };
    notes.write(&args.dir);
    sweep_notes(&args.dir, SystemTime::now());
    code
}

/// How long a job's notes are kept: its tasks print them at every step's start.
const NOTES_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most entries of the notes directory one prolog looks at.
const SWEEP_AT_MOST: usize = 10_000;

/// Removes the notes files (`job-ID.notes`) in `dir` last written more than [`NOTES_KEEP`]
/// before `now`; nothing else there is touched. The epilog leaves a job's notes in place
/// (a requeued job may start on the node again without a new prolog), so this is what
/// keeps the directory small. Errors are ignored: a prolog never fails for them.
fn sweep_notes(dir: &Path, now: SystemTime) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten().take(SWEEP_AT_MOST) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_notes = name
            .strip_prefix("job-")
            .and_then(|n| n.strip_suffix(".notes"))
            .and_then(slurm::job_id)
            .is_some();
        let old = entry
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > NOTES_KEEP);
        if is_notes && old && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The server's answer, or the counter to add to and why there is none.
async fn ask(
    args: &PrologArgs,
    client: anyhow::Result<Client>,
) -> Result<PreflightResponse, (&'static str, String)> {
    let refused = |e: String| ("refused", e);
    let nodes = match std::env::var("SLURMD_NODENAME") {
        Ok(n) if !n.trim().is_empty() => vec![n.trim().to_string()],
        _ => {
            crate::args::nodes(job_nodes().map_err(|e| refused(e.0))?).map_err(|e| refused(e.0))?
        }
    };
    let client = client.map_err(|e| refused(format!("{e:#}")))?;
    let request = PreflightRequest {
        nodes,
        max_age_s: args.max_age,
        check: args.check,
        wait_s: Some(0),
    };
    let call = client.post::<_, PreflightResponse>("/api/v1/preflight", &request);
    match tokio::time::timeout(args.timeout, call).await {
        Err(_) => Err((
            "unreachable",
            format!("the server did not answer within {:?}", args.timeout),
        )),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => {
            let down = match &e {
                ClientError::Unreachable { .. } => true,
                ClientError::Api { status, .. } | ClientError::Unexpected { status, .. } => {
                    status.is_server_error()
                }
                _ => false,
            };
            Err((if down { "unreachable" } else { "refused" }, e.to_string()))
        }
    }
}

fn first_reason(n: &heddle_types::health::PreflightNode) -> String {
    n.reasons
        .first()
        .map(|r| r.message.clone())
        .unwrap_or_else(|| "no reason given".into())
}

fn decide(args: &PrologArgs, answer: &PreflightResponse, notes: &mut Notes) -> ExitCode {
    let check = answer.check.as_str();
    let mut failed = false;
    for n in &answer.nodes {
        let why = first_reason(n);
        match n.verdict {
            Verdict::Pass => {}
            Verdict::Warn => notes.add(format!("heddle: pre-flight {check} WARN on {}: {why}", n.node)),
            Verdict::Unknown => {
                count(&args.dir, "undecided");
                notes.add(format!(
                    "heddle: pre-flight {check} has no verdict for {} ({why}); the job starts unchecked",
                    n.node
                ));
            }
            Verdict::Fail if args.drain => {
                failed = true;
                let reason = slurm::drain_reason(&why);
                match drain(&args.scontrol, &n.node, &reason) {
                    Ok(()) => notes.add(format!(
                        "heddle: pre-flight {check} FAIL on {}: {why}; drained, the job is requeued",
                        n.node
                    )),
                    Err(e) => notes.add(format!(
                        "heddle: pre-flight {check} FAIL on {}: {why}; draining it failed ({e})",
                        n.node
                    )),
                }
            }
            Verdict::Fail => notes.add(format!(
                "heddle: pre-flight {check} FAIL on {}: {why} (left in service: the prolog runs without --drain)",
                n.node
            )),
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn drain(scontrol: &Path, node: &str, reason: &str) -> Result<(), String> {
    let out = std::process::Command::new(scontrol)
        .args(["update", &format!("nodename={node}"), "state=drain"])
        .arg(format!("reason={reason}"))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", scontrol.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Adds one to `name` in the counts file (`NAME COUNT` lines), under a lock: prologs of
/// several jobs run at once.
fn count(dir: &Path, name: &str) {
    let add = || -> std::io::Result<()> {
        use std::io::{Read, Seek};
        std::fs::create_dir_all(dir)?;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(slurm::COUNTS_FILE))?;
        f.lock()?;
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        let mut counts = parse_counts(&text);
        *counts.entry(name.to_string()).or_default() += 1;
        let out: String = counts.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        f.set_len(0)?;
        f.rewind()?;
        f.write_all(out.as_bytes())
    };
    if let Err(e) = add() {
        eprintln!(
            "heddle slurm prolog: cannot count in {}: {e}",
            dir.display()
        );
    }
}

/// The counts file's `NAME COUNT` lines; others are dropped.
pub fn parse_counts(text: &str) -> std::collections::BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_notes_are_swept_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for name in [
            "job-7.notes",
            "job-8.notes",
            "job-x.notes",
            "counts",
            "job-9.tmp42",
        ] {
            std::fs::write(d.join(name), "heddle: pre-flight memcpy WARN on hn-2\n").unwrap();
        }
        std::fs::create_dir(d.join("job-10.notes")).unwrap();
        // Fresh: nothing goes.
        assert_eq!(sweep_notes(d, SystemTime::now()), 0);
        // Eight days on: the two notes files of real job ids, and only they.
        let later = SystemTime::now() + Duration::from_secs(8 * 24 * 3600);
        assert_eq!(sweep_notes(d, later), 2);
        let mut left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["counts", "job-10.notes", "job-9.tmp42", "job-x.notes"]
        );
        // A directory that is not there is no error.
        assert_eq!(sweep_notes(&d.join("missing"), later), 0);
    }

    #[test]
    fn counts_add_up_and_survive_garbage() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(slurm::COUNTS_FILE), "unreachable 4\njunk\n").unwrap();
        count(dir.path(), "unreachable");
        count(dir.path(), "refused");
        let text = std::fs::read_to_string(dir.path().join(slurm::COUNTS_FILE)).unwrap();
        let counts = parse_counts(&text);
        assert_eq!(counts.get("unreachable"), Some(&5));
        assert_eq!(counts.get("refused"), Some(&1));
        assert_eq!(counts.len(), 2);
    }
}
