//! `heddle-agent slurm epilog`: slurmd runs the `Epilog` as root on each node once the
//! job's processes are gone. A process killed by `scancel` (or a time limit) never wrote
//! its final spool file, so its observation would stay "running" at the server until the
//! agent drops the file as stale, ten minutes later. The epilog writes each such file of
//! the job again, as final and with the next `seq`, owned by the uid it was (so the agent
//! reads it by its usual rules); the running agent uploads it on its next scan, or keeps
//! it in its outbox while the server is down. It leaves the pre-flight's notes alone: a
//! job requeued by another node's prolog has its epilog here and may start on this node
//! again under the same id, and Slurm need not run this node's prolog again for it, so the
//! notes are what its tasks print then (the prolog replaces them when it does run, and
//! sweeps old ones). It never fails: an epilog that exits non-zero drains the node.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use heddle_types::slurm as slurm_notes;

use crate::lifecycle::observe::ingest::{self, JobSpool};

#[derive(Debug, clap::Args)]
pub struct EpilogArgs {
    /// The job spool the NCCL profiler plugin writes and the agent reads (`run
    /// --job-spool`).
    #[arg(
        long,
        env = "HEDDLE_JOB_SPOOL",
        default_value = "/var/spool/heddle/jobs"
    )]
    pub job_spool: PathBuf,
}

/// What the epilog did, for its one line on stderr and for tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Finalized {
    pub files: usize,
    pub errors: Vec<String>,
}

pub fn command(args: &EpilogArgs) {
    let Some(job) = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|j| slurm_notes::job_id(&j).map(str::to_string))
    else {
        eprintln!("heddle-agent slurm epilog: no SLURM_JOB_ID; nothing to do");
        return;
    };
    let done = std::panic::catch_unwind(|| finalize(&args.job_spool, &job)).unwrap_or_else(|_| {
        Finalized {
            files: 0,
            errors: vec!["internal error".into()],
        }
    });
    eprintln!(
        "heddle-agent slurm epilog: job {job}: {} spool file(s) marked final{}",
        done.files,
        if done.errors.is_empty() {
            String::new()
        } else {
            format!("; {}", done.errors.join("; "))
        }
    );
}

/// Marks every file of Slurm job `job` in `spool` that is not final as final.
pub fn finalize(spool: &Path, job: &str) -> Finalized {
    let mut out = Finalized::default();
    if std::fs::symlink_metadata(spool).is_err() {
        return out;
    }
    let dir = match JobSpool::open(spool) {
        Ok(d) => d,
        Err(e) => {
            out.errors.push(e.to_string());
            return out;
        }
    };
    let names: Vec<OsString> = match std::fs::read_dir(spool) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .filter(|n| {
                let b = n.as_bytes();
                !b.starts_with(b".") && b.ends_with(b".json")
            })
            .take(ingest::MAX_NAMES_PER_SCAN)
            .collect(),
        Err(e) => {
            out.errors.push(format!("{}: {e}", spool.display()));
            return out;
        }
    };
    for name in names {
        // The agent's own rules: no links, one regular file, the owner it claims.
        let Ok((mut file, uid)) = dir.open_entry(&name).and_then(ingest::read_checked) else {
            continue;
        };
        if file.is_final || file.job.slurm_job_id.as_deref() != Some(job) {
            continue;
        }
        file.is_final = true;
        file.seq = file.seq.saturating_add(1);
        file.written_at = chrono::Utc::now();
        let written = serde_json::to_vec(&file)
            .map_err(std::io::Error::other)
            .and_then(|bytes| dir.replace_as(&name, &bytes, uid));
        match written {
            Ok(()) => out.files += 1,
            Err(e) => out.errors.push(format!("{}: {e}", name.to_string_lossy())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use heddle_types::observe::SpoolFile;

    use super::*;
    use crate::lifecycle::observe::ingest::tests::sample;

    #[test]
    fn only_the_jobs_unfinished_files_become_final_and_the_agent_takes_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("jobs");
        let mut spool = JobSpool::open(&dir).unwrap();
        // SAFETY: no preconditions.
        let uid = unsafe { libc::geteuid() };
        let write = |name: &str, f: &SpoolFile| {
            std::fs::write(dir.join(name), serde_json::to_vec(f).unwrap()).unwrap()
        };
        let mut done = sample(uid, 11, 4);
        done.is_final = true;
        let mut other = sample(uid, 12, 5);
        other.job.slurm_job_id = Some("78".into());
        write("10-1.json", &sample(uid, 10, 3));
        write("11-1.json", &done);
        write("12-1.json", &other);
        let secret = tmp.path().join("secret.json");
        write("../secret.json", &sample(uid, 13, 1));
        std::os::unix::fs::symlink(&secret, dir.join("evil.json")).unwrap();

        let got = finalize(&dir, "77");
        assert_eq!((got.files, got.errors.len()), (1, 0), "{got:?}");
        let report = spool.scan(std::time::SystemTime::now());
        let files: BTreeMap<u32, &SpoolFile> = report
            .ingested
            .iter()
            .map(|i| (i.file.job.pid, &i.file))
            .collect();
        assert!(files[&10].is_final && files[&10].seq == 4);
        assert!(files[&11].is_final && files[&11].seq == 4, "left as it was");
        assert!(!files[&12].is_final, "another job's file");
        // The link's target is never written through, and no temporary file is left.
        let target: SpoolFile = serde_json::from_slice(&std::fs::read(&secret).unwrap()).unwrap();
        assert!(!target.is_final);
        assert!(
            std::fs::read_dir(&dir).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.'))
        );
    }
}
