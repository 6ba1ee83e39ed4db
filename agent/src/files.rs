//! Files on disk, the two ways the agent touches them beyond its own reads: replacing a
//! file whole (its state, the result spool, the node env file, the GPU map, the NCCL
//! runner's rendezvous), and reading a file in a place someone else may write (the env
//! file and GPU map a Slurm task names, the job's notes).
//!
//! `host_conf` replaces system files keeping their owner and mode, and the job spool's
//! reader rewrites a job's files through its directory's descriptor as the job's user
//! (`lifecycle/observe/ingest.rs`); both follow the same temp-file, fsync, rename order.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use uuid::Uuid;

/// What every temporary file [`write_atomic`] makes is named with; a directory's owner may
/// delete such files left by a crash.
pub const TEMP_PREFIX: &str = ".tmp-";

#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FileError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `dir/name` so that a crash at any point leaves either the old state
/// or the complete new file: a new temporary file (`O_EXCL`, so never through a link),
/// exactly `mode`, fsync, rename over the name (which replaces a link there rather than
/// following it), fsync of the directory.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let tmp = dir.join(format!("{TEMP_PREFIX}{name}.{}", Uuid::new_v4().simple()));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        // Exactly `mode`, whatever the umask.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err(&tmp))?;
        file.write_all(bytes).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        let dest = dir.join(name);
        fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Makes a rename or removal in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), FileError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// At most one byte more than `max` (so the caller can tell a file that is too large), from
/// a regular file only, opened without blocking: the path may come from someone else, and
/// a FIFO or `/dev/zero` must not hold the reader up.
pub fn read_bounded(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}
