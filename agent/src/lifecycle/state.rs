//! The agent's state directory: its identity (credential), the result spool, and a lock
//! that keeps two agents from sharing them.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::files::write_atomic;

const IDENTITY_FILE: &str = "identity.json";
/// The ticket of an enrollment waiting for an admin's approval; a restart asks with it
/// again instead of spending another enrollment token.
const PENDING_FILE: &str = "pending-enrollment.json";
const LOCK_FILE: &str = "agent.lock";
const SPOOL_DIR: &str = "spool";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {0} is in use by another heddle-agent")]
    Locked(PathBuf),
    #[error("{path} is not a valid identity file: {source}")]
    BadIdentity {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("writing {0}")]
    Write(#[from] crate::files::FileError),
}

/// What enrollment gave this agent. The credential is a secret: the file is 0600.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub agent_id: Uuid,
    pub node_id: Uuid,
    pub credential: String,
    pub hostname: String,
    pub enrolled_at: DateTime<Utc>,
}

/// An enrollment held for approval: the ticket is a secret (the file is 0600).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingTicket {
    pub pending_id: Uuid,
    pub hostname: String,
    pub ticket: String,
}

/// An open, locked state directory. The lock is an `flock`, released by the kernel when
/// the process dies, so a crashed agent never blocks its successor.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    _lock: File,
}

impl StateDir {
    pub fn open(path: &Path) -> Result<StateDir, StateError> {
        let io = |source| StateError::Io {
            path: path.to_path_buf(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(io)?;
        let lock_path = path.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|source| StateError::Io {
                path: lock_path.clone(),
                source,
            })?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(StateError::Locked(path.to_path_buf()));
        }
        Ok(StateDir {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn identity_path(&self) -> PathBuf {
        self.path.join(IDENTITY_FILE)
    }

    pub fn spool_dir(&self) -> PathBuf {
        self.path.join(SPOOL_DIR)
    }

    pub fn load_identity(&self) -> Result<Option<Identity>, StateError> {
        let path = self.identity_path();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Io { path, source }),
        };
        if let Ok(meta) = fs::metadata(&path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "credential file is readable by others; it should be 0600");
            }
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StateError::BadIdentity { path, source })
    }

    pub fn save_identity(&self, identity: &Identity) -> Result<(), StateError> {
        let bytes = serde_json::to_vec_pretty(identity).expect("identity always serializes");
        write_atomic(&self.path, IDENTITY_FILE, &bytes, 0o600)?;
        Ok(())
    }

    /// The waiting enrollment's ticket, if any. An unreadable file counts as none: the
    /// agent then enrolls afresh with its token.
    pub fn load_pending(&self) -> Option<PendingTicket> {
        let path = self.path.join(PENDING_FILE);
        let bytes = fs::read(&path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(p) => Some(p),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "ignoring an unreadable pending-enrollment file");
                None
            }
        }
    }

    pub fn save_pending(&self, pending: &PendingTicket) -> Result<(), StateError> {
        let bytes = serde_json::to_vec_pretty(pending).expect("a ticket always serializes");
        write_atomic(&self.path, PENDING_FILE, &bytes, 0o600)?;
        Ok(())
    }

    pub fn clear_pending(&self) -> Result<(), StateError> {
        let path = self.path.join(PENDING_FILE);
        match fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(StateError::Io { path, source: err })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            agent_id: Uuid::new_v4(),
            node_id: Uuid::new_v4(),
            credential: "hda_secret".into(),
            hostname: "node-1".into(),
            enrolled_at: Utc::now(),
        }
    }

    #[test]
    fn identity_round_trips_with_private_mode() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(&dir.path().join("state")).unwrap();
        assert!(state.load_identity().unwrap().is_none());
        let id = identity();
        state.save_identity(&id).unwrap();
        let back = state.load_identity().unwrap().unwrap();
        assert_eq!(back.credential, id.credential);
        assert_eq!(back.agent_id, id.agent_id);
        let mode = fs::metadata(state.identity_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = fs::metadata(state.path()).unwrap().permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700);
    }

    #[test]
    fn pending_ticket_round_trips_and_clears() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        assert!(state.load_pending().is_none());
        let p = PendingTicket {
            pending_id: Uuid::new_v4(),
            hostname: "node-1".into(),
            ticket: "hdp_secret".into(),
        };
        state.save_pending(&p).unwrap();
        assert_eq!(state.load_pending().unwrap().ticket, "hdp_secret");
        let mode = fs::metadata(dir.path().join(PENDING_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        state.clear_pending().unwrap();
        assert!(state.load_pending().is_none());
        state.clear_pending().unwrap();
    }

    #[test]
    fn second_open_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateDir::open(dir.path()).unwrap();
        assert!(matches!(
            StateDir::open(dir.path()),
            Err(StateError::Locked(_))
        ));
        drop(first);
        StateDir::open(dir.path()).unwrap();
    }

    #[test]
    fn garbage_identity_is_an_error_not_a_new_enrollment() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::open(dir.path()).unwrap();
        fs::write(state.identity_path(), b"{").unwrap();
        assert!(matches!(
            state.load_identity(),
            Err(StateError::BadIdentity { .. })
        ));
    }
}
