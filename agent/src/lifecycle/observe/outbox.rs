//! Observations waiting for the server, on disk so that a server outage or an agent
//! restart loses none (the result spool's rules: `files::write_atomic`, fsync, removal only
//! after the server answered).
//!
//! One file per process, named `<source>-<pid>-<start_ticks>-<seq>.json`; a later `seq` of
//! the same process replaces the earlier file, so the outbox holds at most one entry per
//! process however long the server is away, and never more than [`MAX_ENTRIES`].

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use heddle_types::observed::Observation;

use crate::files::write_atomic;
use crate::spool::SpoolError;

/// Processes kept waiting at most; beyond it new ones stay in the job spool until the
/// outbox drains (they are not lost: the job spool file is removed only once stored here).
pub const MAX_ENTRIES: usize = 4096;

/// Bytes of one upload at most, well under the server's upload limit
/// (`HEDDLE_MAX_RESULT_BYTES`, 16 MiB by default); a spool file is at most 1 MiB.
pub const MAX_BATCH_BYTES: usize = 8 << 20;

type ProcessKey = (String, u32, u64);

pub struct Outbox {
    dir: PathBuf,
    /// Per process, the seq and file name of its waiting entry.
    index: HashMap<ProcessKey, (u64, String)>,
}

fn parse_name(name: &str) -> Option<(ProcessKey, u64)> {
    let stem = name.strip_suffix(".json")?;
    let mut parts = stem.split('-');
    let source = parts.next()?.to_string();
    let pid = parts.next()?.parse().ok()?;
    let ticks = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    parts
        .next()
        .is_none()
        .then_some(((source, pid, ticks), seq))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Outbox {
    pub fn open(dir: impl Into<PathBuf>) -> Result<Outbox, SpoolError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let mut outbox = Outbox {
            dir,
            index: HashMap::new(),
        };
        for e in fs::read_dir(&outbox.dir).map_err(io(&outbox.dir))? {
            let e = e.map_err(io(&outbox.dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") {
                let _ = fs::remove_file(e.path());
            } else if let Some((key, seq)) = parse_name(&name) {
                outbox.keep(key, seq, name);
            }
        }
        Ok(outbox)
    }

    /// Records an entry, removing an older one of the same process.
    fn keep(&mut self, key: ProcessKey, seq: u64, name: String) {
        match self.index.get(&key) {
            Some((held, _)) if *held >= seq => {
                if self.index.get(&key).is_some_and(|(_, n)| *n != name) {
                    let _ = fs::remove_file(self.dir.join(&name));
                }
            }
            _ => {
                if let Some((_, old)) = self.index.insert(key, (seq, name)) {
                    let _ = fs::remove_file(self.dir.join(old));
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The seq waiting (or last made durable) for a process, if any.
    pub fn held_seq(&self, obs: &Observation) -> Option<u64> {
        self.index.get(&key_of(obs)).map(|(s, _)| *s)
    }

    /// Stores `obs` durably; `Ok(false)` when the outbox is full and it was not stored.
    pub fn put(&mut self, obs: &Observation) -> Result<bool, SpoolError> {
        let key = key_of(obs);
        if !self.index.contains_key(&key) && self.index.len() >= MAX_ENTRIES {
            return Ok(false);
        }
        if self
            .index
            .get(&key)
            .is_some_and(|(s, _)| *s >= obs.file.seq)
        {
            return Ok(true);
        }
        let name = format!("{}-{}-{}-{}.json", key.0, key.1, key.2, obs.file.seq);
        let bytes = serde_json::to_vec(obs).expect("an observation serializes");
        write_atomic(&self.dir, &name, &bytes, 0o600)?;
        self.keep(key, obs.file.seq, name);
        Ok(true)
    }

    /// Up to `n` waiting entries (file name and content) of at most [`MAX_BATCH_BYTES`] in
    /// all (one entry always goes). An unreadable one is removed with an error logged: it
    /// was written by this agent, so it can only be damage.
    pub fn batch(&mut self, n: usize) -> Vec<(String, Observation)> {
        let mut bytes_in = 0usize;
        let mut names: Vec<String> = self.index.values().map(|(_, n)| n.clone()).collect();
        names.sort();
        let mut out = Vec::new();
        for name in names {
            if out.len() >= n {
                break;
            }
            let path = self.dir.join(&name);
            let read = fs::read(&path).map_err(|e| e.to_string());
            if let Ok(b) = &read {
                if !out.is_empty() && bytes_in + b.len() > MAX_BATCH_BYTES {
                    break;
                }
                bytes_in += b.len();
            }
            match read.and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string())) {
                Ok(obs) => out.push((name, obs)),
                Err(err) => {
                    tracing::error!(path = %path.display(), error = %err, "unreadable observation in the outbox; removing it");
                    self.ack(&name);
                }
            }
        }
        out
    }

    /// Removes an entry the server answered for, unless a later seq replaced it.
    pub fn ack(&mut self, name: &str) {
        let Some((key, _)) = parse_name(name) else {
            return;
        };
        if self.index.get(&key).is_some_and(|(_, n)| n == name) {
            self.index.remove(&key);
        }
        let path = self.dir.join(name);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an uploaded observation");
        }
    }
}

fn key_of(obs: &Observation) -> ProcessKey {
    (
        obs.source.as_str().to_string(),
        obs.file.job.pid,
        obs.file.job.start_ticks,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_types::observed::ObservationSource;

    fn obs(pid: u32, seq: u64) -> Observation {
        Observation {
            source: ObservationSource::Profiler,
            file: super::super::ingest::tests::sample(1000, pid, seq),
        }
    }

    #[test]
    fn latest_seq_replaces_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(dir.path()).unwrap();
        assert!(o.put(&obs(1, 1)).unwrap());
        assert!(o.put(&obs(1, 3)).unwrap());
        assert!(
            o.put(&obs(1, 2)).unwrap(),
            "an older seq is already covered"
        );
        assert!(o.put(&obs(2, 1)).unwrap());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
        let mut o = Outbox::open(dir.path()).unwrap();
        let batch = o.batch(10);
        let seqs: Vec<u64> = batch.iter().map(|(_, b)| b.file.seq).collect();
        assert_eq!(seqs, vec![3, 1]);
        // A newer seq written while a batch was in flight is not removed by its ack.
        o.put(&obs(1, 4)).unwrap();
        for (name, _) in &batch {
            o.ack(name);
        }
        assert_eq!(o.len(), 1);
        assert_eq!(o.batch(10)[0].1.file.seq, 4);
    }

    #[test]
    fn damaged_entry_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("profiler-1-2-3.json"), b"{").unwrap();
        let mut o = Outbox::open(dir.path()).unwrap();
        assert!(o.batch(10).is_empty());
        assert!(o.is_empty());
    }
}
