//! Reading the node env file as root's word: opened without following a symlink (and
//! without blocking on a FIFO), checked on the open descriptor (a regular file, owned by the
//! expected user, not writable by group or others, within the size limit), read whole,
//! hashed, and parsed by `heddle_types::nccl_conf::parse` only. Any refusal refuses the whole
//! file; single entries are judged afterwards by `nccl_conf::check_node_entry`.

use std::fmt;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use heddle_types::nccl_conf::{self, ConfError, Entry, MAX_CONF_FILE_LEN};
use sha2::{Digest, Sha256};

/// A file accepted whole: its hash and the entries that passed the policy.
#[derive(Debug)]
pub struct NodeFile {
    /// SHA-256 (hex) of the file's bytes, as `sha256sum` prints it.
    pub sha256: String,
    pub entries: Vec<Entry>,
    /// Entries the policy refused, with why; the rest of the file still applies.
    pub dropped: Vec<(String, String)>,
}

/// Why the whole file was not applied.
#[derive(Debug)]
pub enum Refusal {
    Missing,
    Symlink,
    Open(std::io::Error),
    NotRegular,
    Owner { uid: u32, expected: u32 },
    Writable { mode: u32 },
    TooLarge { len: u64 },
    Read(std::io::Error),
    Conf(ConfError),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing => write!(f, "it does not exist"),
            Refusal::Symlink => write!(f, "it is a symbolic link"),
            Refusal::Open(e) => write!(f, "it cannot be opened: {e}"),
            Refusal::NotRegular => write!(f, "it is not a regular file"),
            Refusal::Owner { uid, expected } => {
                write!(f, "it is owned by uid {uid}, not {expected}")
            }
            Refusal::Writable { mode } => write!(
                f,
                "its mode {:o} lets group or others write it",
                mode & 0o7777
            ),
            Refusal::TooLarge { len } => {
                write!(f, "it is {len} bytes; at most {MAX_CONF_FILE_LEN} are read")
            }
            Refusal::Read(e) => write!(f, "it cannot be read: {e}"),
            Refusal::Conf(e) => write!(f, "it is not a valid NCCL conf file: {e}"),
        }
    }
}

/// Owner, type, mode and size of an opened file, judged against the owner the file must
/// have (root in production).
pub fn check_metadata(meta: &Metadata, expected_uid: u32) -> Result<(), Refusal> {
    if !meta.file_type().is_file() {
        return Err(Refusal::NotRegular);
    }
    if meta.uid() != expected_uid {
        return Err(Refusal::Owner {
            uid: meta.uid(),
            expected: expected_uid,
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Refusal::Writable { mode: meta.mode() });
    }
    if meta.len() > MAX_CONF_FILE_LEN as u64 {
        return Err(Refusal::TooLarge { len: meta.len() });
    }
    Ok(())
}

/// Opens, checks, reads and parses the file at `path`, which must be owned by
/// `expected_uid`.
pub fn load(path: &Path, expected_uid: u32) -> Result<NodeFile, Refusal> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        // O_NONBLOCK: a FIFO put in the file's place must not hang the job in open(2); it
        // is refused as not regular right after.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => Refusal::Missing,
            Some(libc::ELOOP) => Refusal::Symlink,
            _ => Refusal::Open(e),
        })?;
    let meta = file.metadata().map_err(Refusal::Read)?;
    check_metadata(&meta, expected_uid)?;
    let bytes = read_bounded(file)?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let parsed = nccl_conf::parse(&bytes).map_err(Refusal::Conf)?;
    let (mut entries, mut dropped) = (Vec::new(), Vec::new());
    for entry in parsed {
        match nccl_conf::check_node_entry(&entry.name, &entry.value) {
            Ok(()) => entries.push(entry),
            Err(why) => dropped.push((entry.name, why)),
        }
    }
    Ok(NodeFile {
        sha256,
        entries,
        dropped,
    })
}

/// At most one byte more than the limit, so a file that grew after `fstat` is still caught.
fn read_bounded(file: File) -> Result<Vec<u8>, Refusal> {
    let mut bytes = Vec::new();
    file.take(MAX_CONF_FILE_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(Refusal::Read)?;
    if bytes.len() > MAX_CONF_FILE_LEN {
        return Err(Refusal::TooLarge {
            len: bytes.len() as u64,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> u32 {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    }

    fn write(dir: &Path, name: &str, text: &[u8], mode: u32) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn a_file_of_the_expected_owner_is_read_and_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let text = b"# node a\nNCCL_IB_HCA=mlx5_0\nLD_PRELOAD=/x.so\n";
        let path = write(dir.path(), "nccl.env", text, 0o644);
        let got = load(&path, me()).unwrap();
        assert_eq!(got.sha256, hex::encode(Sha256::digest(text)));
        assert_eq!(got.entries.len(), 1);
        assert_eq!(got.entries[0].name, "NCCL_IB_HCA");
        assert_eq!(got.dropped.len(), 1);
        assert_eq!(got.dropped[0].0, "LD_PRELOAD");
    }

    #[test]
    fn the_owner_must_be_the_expected_user() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "nccl.env", b"NCCL_ALGO=Ring\n", 0o644);
        let other = me().wrapping_add(1);
        assert!(matches!(
            load(&path, other),
            Err(Refusal::Owner { expected, .. }) if expected == other
        ));
    }

    #[test]
    fn hostile_files_are_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let good = write(dir.path(), "good", b"NCCL_ALGO=Ring\n", 0o600);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(matches!(load(&link, me()), Err(Refusal::Symlink)));
        assert!(matches!(
            load(&dir.path().join("absent"), me()),
            Err(Refusal::Missing)
        ));
        assert!(matches!(load(dir.path(), me()), Err(Refusal::NotRegular)));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert!(matches!(load(&fifo, me()), Err(Refusal::NotRegular)));
        for mode in [0o664, 0o646, 0o666] {
            let p = write(dir.path(), "w", b"NCCL_ALGO=Ring\n", mode);
            assert!(
                matches!(load(&p, me()), Err(Refusal::Writable { .. })),
                "{mode:o}"
            );
        }
        let big = write(dir.path(), "big", &vec![b'#'; MAX_CONF_FILE_LEN + 1], 0o644);
        assert!(matches!(load(&big, me()), Err(Refusal::TooLarge { .. })));
        let bad = write(dir.path(), "bad", b"NCCL_ALGO=Ring\nnot a line\n", 0o644);
        assert!(matches!(load(&bad, me()), Err(Refusal::Conf(_))));
    }
}
