//! The result spool: every job result is made durable on disk before it is uploaded, and
//! is removed only once the server has acknowledged it.
//!
//! One result is one JSON file named `<seq>-<job_id>.json`, where `seq` is a zero-padded
//! counter, so a directory listing sorted by name is the order the results were produced.
//! A file is written as `.tmp-<...>`, fsynced, renamed to its final name and then the
//! directory is fsynced: after a crash a final name always holds a complete entry, and a
//! leftover temp file is only a write that never finished (it is deleted on open). The
//! `upload_key` inside each entry is generated once, when the result is first spooled, so
//! re-sending an entry after a crash cannot store the result twice.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use heddle_types::jobs::ResultUpload;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::files::{FileError, TEMP_PREFIX, write_atomic};

const SUFFIX: &str = ".json";
/// Entries that cannot be parsed or that the server refused for good are moved here, so
/// they neither block the queue nor vanish without a trace.
const QUARANTINE_DIR: &str = "rejected";

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spool entry {path} is not valid JSON: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl From<FileError> for SpoolError {
    fn from(e: FileError) -> Self {
        SpoolError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    Ok(crate::files::sync_dir(dir)?)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What is kept on disk for one finished job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpoolEntry {
    pub job_id: Uuid,
    pub run_id: Uuid,
    pub spooled_at: DateTime<Utc>,
    pub upload: ResultUpload,
}

/// Handle on one spooled file; `ack` or `reject` consume it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpoolId {
    seq: u64,
    file_name: String,
}

impl SpoolId {
    pub fn file_name(&self) -> &str {
        &self.file_name
    }

    /// The job the entry is a result of, from its name (`<seq>-<job_id>.json`).
    pub fn job_id(&self) -> Option<Uuid> {
        let stem = self.file_name.strip_suffix(SUFFIX)?;
        stem.split_once('-')?.1.parse().ok()
    }
}

impl std::fmt::Display for SpoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.file_name)
    }
}

/// A directory of pending results. Cheap to clone; clones share the sequence counter.
///
/// Only one process may own a spool directory at a time (the agent holds a lock on its
/// state directory); within the process, writes may come from several tasks.
#[derive(Debug, Clone)]
pub struct Spool {
    dir: PathBuf,
    next_seq: Arc<AtomicU64>,
}

impl Spool {
    /// Opens (creating if needed) the spool in `dir`, deleting temp files left by a crash.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Spool, SpoolError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        // Private even when the state directory above it is searchable by job users (for
        // the node env file kept beside it).
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io_err(&dir))?;
        let mut max_seq = 0;
        for dirent in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let dirent = dirent.map_err(io_err(&dir))?;
            let name = dirent.file_name().to_string_lossy().into_owned();
            if name.starts_with(TEMP_PREFIX) {
                let path = dirent.path();
                tracing::warn!(path = %path.display(), "deleting unfinished spool write left by a crash");
                fs::remove_file(&path).map_err(io_err(&path))?;
            } else if let Some(seq) = parse_name(&name) {
                max_seq = max_seq.max(seq);
            }
        }
        Ok(Spool {
            dir,
            next_seq: Arc::new(AtomicU64::new(max_seq + 1)),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Durably stores `entry`; when this returns, the result survives a crash or power loss.
    pub fn write(&self, entry: &SpoolEntry) -> Result<SpoolId, SpoolError> {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let file_name = format!("{seq:016}-{}{SUFFIX}", entry.job_id);
        let bytes = serde_json::to_vec_pretty(entry).expect("spool entries always serialize");
        write_atomic(&self.dir, &file_name, &bytes, 0o600)?;
        Ok(SpoolId { seq, file_name })
    }

    /// Pending entries, oldest first. Temp files are ignored.
    pub fn list(&self) -> Result<Vec<SpoolId>, SpoolError> {
        let mut ids = Vec::new();
        for dirent in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let dirent = dirent.map_err(io_err(&self.dir))?;
            if !dirent.file_type().map_err(io_err(&self.dir))?.is_file() {
                continue;
            }
            let file_name = dirent.file_name().to_string_lossy().into_owned();
            if let Some(seq) = parse_name(&file_name) {
                ids.push(SpoolId { seq, file_name });
            }
        }
        ids.sort();
        Ok(ids)
    }

    pub fn read(&self, id: &SpoolId) -> Result<SpoolEntry, SpoolError> {
        let path = self.dir.join(&id.file_name);
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        serde_json::from_slice(&bytes).map_err(|source| SpoolError::Corrupt { path, source })
    }

    /// Removes an entry the server acknowledged. The directory is fsynced so the removal
    /// is durable; were it lost, the entry would only be re-sent under the same key.
    pub fn ack(&self, id: &SpoolId) -> Result<(), SpoolError> {
        let path = self.dir.join(&id.file_name);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io_err(&path)(err)),
        }
        sync_dir(&self.dir)
    }

    /// Moves an entry out of the queue (it is corrupt, or the server refused it for good)
    /// and writes `why` beside it.
    pub fn reject(&self, id: &SpoolId, why: &str) -> Result<PathBuf, SpoolError> {
        let qdir = self.dir.join(QUARANTINE_DIR);
        fs::create_dir_all(&qdir).map_err(io_err(&qdir))?;
        let from = self.dir.join(&id.file_name);
        let to = qdir.join(&id.file_name);
        fs::rename(&from, &to).map_err(io_err(&from))?;
        write_atomic(
            &qdir,
            &format!("{}.why", id.file_name),
            why.as_bytes(),
            0o600,
        )?;
        sync_dir(&self.dir)?;
        Ok(to)
    }
}

fn parse_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(SUFFIX)?;
    let (seq, _job) = stem.split_once('-')?;
    if seq.len() != 16 {
        return None;
    }
    seq.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::jobs::Outcome;

    #[test]
    fn the_spool_directory_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        fs::create_dir(&spool_dir).unwrap();
        fs::set_permissions(&spool_dir, fs::Permissions::from_mode(0o755)).unwrap();
        Spool::open(&spool_dir).unwrap();
        let mode = fs::metadata(&spool_dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    fn entry(n: u8) -> SpoolEntry {
        let now = Utc::now();
        SpoolEntry {
            job_id: Uuid::from_u128(n as u128),
            run_id: Uuid::from_u128(1000 + n as u128),
            spooled_at: now,
            upload: ResultUpload {
                upload_key: Uuid::new_v4().to_string(),
                outcome: Outcome::Succeeded,
                reason: None,
                exit_code: Some(0),
                stderr_tail: Some(format!("entry {n}")),
                summary: serde_json::json!({"n": n}),
                rows: vec![],
                started_at: now,
                finished_at: now,
                claim_id: None,
            },
        }
    }

    #[test]
    fn write_list_read_ack_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let e = entry(1);
        let id = spool.write(&e).unwrap();
        assert_eq!(spool.list().unwrap(), vec![id.clone()]);
        // Heartbeats name the job, so its lease lives while the result waits here.
        assert_eq!(id.job_id(), Some(e.job_id));
        assert_eq!(spool.read(&id).unwrap(), e);
        spool.ack(&id).unwrap();
        assert!(spool.list().unwrap().is_empty());
        // A second ack (e.g. after a crash between upload and removal) is harmless.
        spool.ack(&id).unwrap();
    }

    #[test]
    fn files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let id = spool.write(&entry(1)).unwrap();
        let mode = fs::metadata(dir.path().join(id.file_name()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn order_is_preserved_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        // Job ids chosen so that name order differs from job-id order.
        for n in [9u8, 3, 7] {
            spool.write(&entry(n)).unwrap();
        }
        let reopened = Spool::open(dir.path()).unwrap();
        reopened.write(&entry(1)).unwrap();
        let jobs: Vec<u128> = reopened
            .list()
            .unwrap()
            .iter()
            .map(|id| reopened.read(id).unwrap().job_id.as_u128())
            .collect();
        assert_eq!(jobs, vec![9, 3, 7, 1]);
    }

    #[test]
    fn sequence_continues_after_acked_entries() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let a = spool.write(&entry(1)).unwrap();
        let b = spool.write(&entry(2)).unwrap();
        spool.ack(&a).unwrap();
        let reopened = Spool::open(dir.path()).unwrap();
        let c = reopened.write(&entry(3)).unwrap();
        assert!(c > b, "{c} must sort after {b}");
    }

    #[test]
    fn torn_temp_file_is_ignored_and_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let id = spool.write(&entry(1)).unwrap();
        // A crash in the middle of a write leaves a truncated temp file behind.
        let torn = dir
            .path()
            .join(format!("{TEMP_PREFIX}0000000000000002-x.json.abc"));
        fs::write(&torn, b"{\"job_id\": \"00000000-").unwrap();
        assert_eq!(spool.list().unwrap(), vec![id.clone()]);
        let reopened = Spool::open(dir.path()).unwrap();
        assert!(!torn.exists());
        assert_eq!(reopened.list().unwrap(), vec![id]);
    }

    #[test]
    fn unrelated_files_are_not_entries() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        fs::write(dir.path().join("README"), b"x").unwrap();
        fs::write(dir.path().join("12-short.json"), b"{}").unwrap();
        fs::create_dir(dir.path().join("0000000000000005-dir.json")).unwrap();
        assert!(spool.list().unwrap().is_empty());
    }

    #[test]
    fn corrupt_entry_is_reported_and_can_be_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let good = spool.write(&entry(1)).unwrap();
        let bad_name = "0000000000000000-bad.json";
        fs::write(dir.path().join(bad_name), b"{not json").unwrap();
        let ids = spool.list().unwrap();
        assert_eq!(ids[0].file_name(), bad_name);
        assert!(matches!(
            spool.read(&ids[0]),
            Err(SpoolError::Corrupt { .. })
        ));
        let moved = spool.reject(&ids[0], "not JSON").unwrap();
        assert!(moved.exists());
        assert_eq!(
            fs::read_to_string(moved.with_file_name(format!("{bad_name}.why"))).unwrap(),
            "not JSON"
        );
        assert_eq!(spool.list().unwrap(), vec![good]);
    }

    #[test]
    fn concurrent_writers_get_distinct_files() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path()).unwrap();
        let handles: Vec<_> = (0..8u8)
            .map(|n| {
                let spool = spool.clone();
                std::thread::spawn(move || spool.write(&entry(n)).unwrap())
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(spool.list().unwrap().len(), 8);
    }
}
