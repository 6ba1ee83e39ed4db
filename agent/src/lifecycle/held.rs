//! Results the disk would not take (full, read-only, gone): held in memory, oldest first,
//! until they can be spooled after all or the server has acknowledged them.
//!
//! A held result is lost if the agent dies before either happens; that is the price of a
//! disk that refuses writes, and the log says so when it starts. The queue is bounded by
//! back-pressure rather than by dropping: while [`HELD_MAX`] results are held the agent
//! claims no new job, so at most `HELD_MAX + max_parallel` are ever held.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::spool::{Spool, SpoolEntry, SpoolError};

/// The claim loop pauses while this many results wait in memory.
pub(crate) const HELD_MAX: usize = 64;

pub(crate) struct Held {
    queue: Mutex<VecDeque<SpoolEntry>>,
    /// How many results are held; the claim loop waits on it.
    count: watch::Sender<usize>,
}

impl Default for Held {
    fn default() -> Held {
        Held {
            queue: Mutex::new(VecDeque::new()),
            count: watch::channel(0).0,
        }
    }
}

impl Held {
    /// Holds a result the spool refused; returns how many are held now.
    pub fn push(&self, entry: SpoolEntry) -> usize {
        let mut q = self.queue.lock().expect("held lock");
        q.push_back(entry);
        self.count.send_replace(q.len());
        q.len()
    }

    pub fn len(&self) -> usize {
        *self.count.borrow()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The jobs whose results are held.
    pub fn job_ids(&self) -> Vec<uuid::Uuid> {
        let q = self.queue.lock().expect("held lock");
        q.iter().map(|e| e.job_id).collect()
    }

    /// The oldest held result, still held.
    pub fn front(&self) -> Option<SpoolEntry> {
        self.queue.lock().expect("held lock").front().cloned()
    }

    /// Lets go of the result uploaded under `upload_key` (acknowledged or refused for good).
    pub fn remove(&self, upload_key: &str) {
        let mut q = self.queue.lock().expect("held lock");
        q.retain(|e| e.upload.upload_key != upload_key);
        self.count.send_replace(q.len());
    }

    /// Moves held results to the spool, oldest first, until a write fails. Returns how
    /// many moved and the error that stopped it, if any. A result is let go of only once
    /// its spool file is durable, and it keeps its upload key.
    pub fn spool_to(&self, spool: &Spool) -> (usize, Option<SpoolError>) {
        let mut moved = 0;
        loop {
            let Some(entry) = self.front() else {
                return (moved, None);
            };
            match spool.write(&entry) {
                Ok(id) => {
                    tracing::info!(job_id = %entry.job_id, spool_entry = %id,
                        "a result held in memory is spooled now that the disk takes it");
                    self.remove(&entry.upload.upload_key);
                    moved += 1;
                }
                Err(err) => return (moved, Some(err)),
            }
        }
    }

    /// Returns once fewer than [`HELD_MAX`] results are held.
    pub async fn wait_for_room(&self) {
        let mut rx = self.count.subscribe();
        if *rx.borrow_and_update() < HELD_MAX {
            return;
        }
        tracing::warn!(
            held = HELD_MAX,
            "no new job is claimed while this many results wait in memory for the disk or the server"
        );
        // The sender lives as long as `self`.
        let _ = rx.wait_for(|n| *n < HELD_MAX).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use heddle_types::jobs::{Outcome, ResultUpload};
    use uuid::Uuid;

    fn entry(n: u128) -> SpoolEntry {
        let now = Utc::now();
        SpoolEntry {
            job_id: Uuid::from_u128(n),
            run_id: Uuid::from_u128(1000 + n),
            spooled_at: now,
            upload: ResultUpload {
                upload_key: format!("key-{n}"),
                outcome: Outcome::Succeeded,
                reason: None,
                exit_code: Some(0),
                stderr_tail: None,
                summary: serde_json::json!({}),
                rows: vec![],
                started_at: now,
                finished_at: now,
                claim_id: None,
            },
        }
    }

    #[test]
    fn held_results_move_to_the_spool_once_it_takes_writes() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        let spool = Spool::open(&spool_dir).unwrap();
        let held = Held::default();
        held.push(entry(1));
        held.push(entry(2));

        // The directory is gone: every write fails and nothing is let go of.
        std::fs::remove_dir(&spool_dir).unwrap();
        let (moved, err) = held.spool_to(&spool);
        assert_eq!((moved, err.is_some()), (0, true));
        assert_eq!(held.len(), 2);

        std::fs::create_dir(&spool_dir).unwrap();
        let (moved, err) = held.spool_to(&spool);
        assert_eq!((moved, err.is_none()), (2, true));
        assert_eq!(held.len(), 0);
        let keys: Vec<String> = spool
            .list()
            .unwrap()
            .iter()
            .map(|id| spool.read(id).unwrap().upload.upload_key)
            .collect();
        assert_eq!(keys, ["key-1", "key-2"], "oldest first, keys kept");
    }

    #[tokio::test]
    async fn a_full_queue_holds_back_claims_until_a_result_leaves() {
        let held = std::sync::Arc::new(Held::default());
        for n in 0..HELD_MAX as u128 {
            held.push(entry(n));
        }
        let waiter = tokio::spawn({
            let held = held.clone();
            async move { held.wait_for_room().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        held.remove("key-0");
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("room after one result left")
            .unwrap();
        assert_eq!(held.front().unwrap().upload.upload_key, "key-1");
    }
}
