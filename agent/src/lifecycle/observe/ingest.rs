//! Reading the job spool, which job users write and the root agent reads: every file is
//! hostile until proven otherwise.
//!
//! The directory must be the agent's own (owned by its effective uid, root in production)
//! and sticky, so users can add files but not remove or rename each other's. Each file is
//! opened relative to the directory's descriptor with `O_NOFOLLOW | O_NONBLOCK`, so a
//! symbolic link is refused and a FIFO cannot block the agent; then `fstat` on the open
//! descriptor decides: a regular file, one link, at most [`MAX_SPOOL_FILE_LEN`] bytes,
//! owned by the uid the file claims for its job. Only then is it read (bounded) and parsed
//! by [`SpoolFile::parse`]. A scan looks at a bounded number of files, and of those at most
//! [`MAX_FILES_PER_UID`] of one owner, so a flood from one user delays others only by
//! scans, never starves them or the agent. A refused file is logged once, counted by
//! reason and removed (a directory is left, and remembered).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use heddle_types::observe::{MAX_SPOOL_FILE_LEN, SpoolFile};

/// Files opened and read in one scan at most; the rest wait for the next.
pub const MAX_FILES_PER_SCAN: usize = 256;
/// Files of one owner read in one scan at most.
pub const MAX_FILES_PER_UID: usize = 32;
/// Names looked at in one scan at most (a directory of millions is read a slice a scan).
pub const MAX_NAMES_PER_SCAN: usize = 65_536;
/// A file not rewritten for this long is a process that ended without a final write: it
/// is read one last time and removed.
pub const STALE_AFTER: Duration = Duration::from_secs(600);

/// Why the spool directory cannot be used; the agent goes on without it.
#[derive(Debug, thiserror::Error)]
pub enum SpoolDirError {
    #[error("job spool {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error(
        "job spool {path} is {what}; it must be a directory owned by uid {euid} (the agent) with \
         the sticky bit, e.g. `install -d -o root -m 1733 {path}`"
    )]
    Unsafe {
        path: PathBuf,
        what: String,
        euid: u32,
    },
}

/// Why one file was refused. Each says what was wrong, for the one log line it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Symlink,
    NotRegular(&'static str),
    HardLinked(u64),
    TooLarge(u64),
    Owner { file_uid: u32, job_uid: u32 },
    Content(String),
    Open(String),
}

impl Refusal {
    /// The counter label.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Symlink => "symlink",
            Refusal::NotRegular(_) => "not_regular",
            Refusal::HardLinked(_) => "hard_linked",
            Refusal::TooLarge(_) => "too_large",
            Refusal::Owner { .. } => "owner",
            Refusal::Content(_) => "content",
            Refusal::Open(_) => "open",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Symlink => f.write_str("a symbolic link; links are never followed"),
            Refusal::NotRegular(kind) => write!(f, "a {kind}, not a regular file"),
            Refusal::HardLinked(n) => write!(f, "has {n} hard links; a spool file has one"),
            Refusal::TooLarge(n) => {
                write!(f, "{n} bytes; at most {MAX_SPOOL_FILE_LEN} are read")
            }
            Refusal::Owner { file_uid, job_uid } => write!(
                f,
                "owned by uid {file_uid} but describes a job of uid {job_uid}; a process may \
                 only report itself"
            ),
            Refusal::Content(e) => write!(f, "refused content: {e}"),
            Refusal::Open(e) => write!(f, "cannot be opened: {e}"),
        }
    }
}

/// The owner rule: a file describes the job of the uid that wrote it.
pub fn check_owner(file_uid: u32, job_uid: u32) -> Result<(), Refusal> {
    if file_uid == job_uid {
        Ok(())
    } else {
        Err(Refusal::Owner { file_uid, job_uid })
    }
}

fn kind_of(mode: u32) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFDIR => Some("directory"),
        libc::S_IFIFO => Some("FIFO"),
        libc::S_IFSOCK => Some("socket"),
        libc::S_IFCHR => Some("character device"),
        libc::S_IFBLK => Some("block device"),
        libc::S_IFLNK => Some("symbolic link"),
        _ => Some("special file"),
    }
}

/// Reads `file` (already opened without following links) after checking what `fstat`
/// says about it, and parses it strictly.
pub fn read_checked(mut file: File) -> Result<(SpoolFile, u32), Refusal> {
    let meta = file.metadata().map_err(|e| Refusal::Open(e.to_string()))?;
    if let Some(kind) = kind_of(meta.mode()) {
        return Err(Refusal::NotRegular(kind));
    }
    if meta.nlink() != 1 {
        return Err(Refusal::HardLinked(meta.nlink()));
    }
    if meta.len() > MAX_SPOOL_FILE_LEN as u64 {
        return Err(Refusal::TooLarge(meta.len()));
    }
    // Bounded even if the file grows after the fstat.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&mut file)
        .take(MAX_SPOOL_FILE_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Refusal::Open(e.to_string()))?;
    if bytes.len() > MAX_SPOOL_FILE_LEN {
        return Err(Refusal::TooLarge(bytes.len() as u64));
    }
    let spool = SpoolFile::parse(&bytes).map_err(|e| Refusal::Content(e.to_string()))?;
    check_owner(meta.uid(), spool.job.uid)?;
    Ok((spool, meta.uid()))
}

/// What a directory entry looked like when it was last read, so an unchanged file is not
/// read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: i64,
    mtime_ns: i64,
}

/// A file read in a scan.
#[derive(Debug)]
pub struct Ingested {
    pub name: OsString,
    pub file: SpoolFile,
    /// Not rewritten for [`STALE_AFTER`]: remove it once its content is safe elsewhere.
    pub stale: bool,
}

#[derive(Debug, Default)]
pub struct ScanReport {
    pub ingested: Vec<Ingested>,
    pub refused: Vec<(OsString, Refusal)>,
    /// Files left for a later scan by the per-scan or per-owner bounds.
    pub deferred: usize,
}

/// The job spool directory, opened and checked once.
pub struct JobSpool {
    path: PathBuf,
    dir: File,
    seen: HashMap<OsString, Stamp>,
    /// Refusals so far, by [`Refusal::label`].
    pub refusals: BTreeMap<&'static str, u64>,
}

impl JobSpool {
    /// Creates the directory (mode 1733) when missing, then checks that it is the agent's
    /// own and sticky; refuses it otherwise.
    pub fn open(path: &Path) -> Result<JobSpool, SpoolDirError> {
        let io = |e| SpoolDirError::Io(path.to_path_buf(), e);
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if std::fs::symlink_metadata(path).is_err() {
            std::fs::create_dir_all(path).map_err(io)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1733)).map_err(io)?;
        }
        let unsafe_dir = |what: String| SpoolDirError::Unsafe {
            path: path.to_path_buf(),
            what,
            euid,
        };
        let meta = std::fs::symlink_metadata(path).map_err(io)?;
        if meta.file_type().is_symlink() {
            return Err(unsafe_dir("a symbolic link".into()));
        }
        if !meta.is_dir() {
            return Err(unsafe_dir("not a directory".into()));
        }
        if meta.uid() != euid {
            return Err(unsafe_dir(format!("owned by uid {}", meta.uid())));
        }
        let empty = || std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none());
        if meta.mode() & 0o1000 == 0 && empty() {
            // The agent's own empty directory (a hostPath `DirectoryOrCreate` makes one
            // 0755): made what it must be. One with files in it might be anything (a
            // mistyped path) and is left alone.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1733)).map_err(io)?;
            tracing::info!(dir = %path.display(), "job spool made sticky (mode 1733)");
        } else if meta.mode() & 0o1000 == 0 {
            return Err(unsafe_dir(format!(
                "mode {:04o}, without the sticky bit",
                meta.mode() & 0o7777
            )));
        }
        JobSpool::open_dir(path)
    }

    /// A directory someone else keeps (NCCL Inspector's): only refused when it is a link
    /// or not a directory.
    pub fn open_any(path: &Path) -> Result<JobSpool, SpoolDirError> {
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| SpoolDirError::Io(path.to_path_buf(), e))?;
        if !meta.is_dir() {
            return Err(SpoolDirError::Io(
                path.to_path_buf(),
                std::io::Error::other("not a directory (links are not followed)"),
            ));
        }
        JobSpool::open_dir(path)
    }

    fn open_dir(path: &Path) -> Result<JobSpool, SpoolDirError> {
        let io = |e| SpoolDirError::Io(path.to_path_buf(), e);
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io(std::io::Error::other("a path with a NUL byte")))?;
        // SAFETY: `c` is a valid C string; the descriptor returned is owned by the File.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let dir = unsafe { File::from_raw_fd(fd) };
        Ok(JobSpool {
            path: path.to_path_buf(),
            dir,
            seen: HashMap::new(),
            refusals: BTreeMap::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `lstat` of an entry, relative to the directory.
    fn lstat(&self, name: &OsStr) -> Option<libc::stat> {
        let c = CString::new(name.as_bytes()).ok()?;
        // SAFETY: zeroed stat is a valid out-parameter; `c` is a valid C string.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::fstatat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        (rc == 0).then_some(st)
    }

    /// Opens an entry relative to the directory, never following a link or blocking.
    pub fn open_entry(&self, name: &OsStr) -> Result<File, Refusal> {
        let c = CString::new(name.as_bytes()).map_err(|_| Refusal::Open("NUL in name".into()))?;
        // SAFETY: `c` is a valid C string, the directory descriptor is open.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return Err(if err.raw_os_error() == Some(libc::ELOOP) {
                Refusal::Symlink
            } else {
                Refusal::Open(err.to_string())
            });
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Removes an entry (never a directory; a link itself, not its target).
    pub fn remove(&mut self, name: &OsStr) {
        self.seen.remove(name);
        let Ok(c) = CString::new(name.as_bytes()) else {
            return;
        };
        // SAFETY: `c` is a valid C string, the directory descriptor is open.
        if unsafe { libc::unlinkat(self.dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = ?name, dir = %self.path.display(), error = %err, "cannot remove a job spool file");
            }
        }
    }

    /// Writes `bytes` over the entry `name` atomically (a private temporary file renamed
    /// over it), owned by `uid`, so that the owner rule still holds for what it says: the
    /// Slurm epilog's final copy of a killed job's file.
    pub fn replace_as(&self, name: &OsStr, bytes: &[u8], uid: u32) -> std::io::Result<()> {
        let tmp = CString::new(format!(".heddle-final-{}", std::process::id()))
            .map_err(std::io::Error::other)?;
        let target = CString::new(name.as_bytes()).map_err(std::io::Error::other)?;
        let dir = self.dir.as_raw_fd();
        // SAFETY: valid C strings and an open directory descriptor. A leftover of a crashed
        // run is removed first (root may remove any entry of the sticky directory).
        let fd = unsafe {
            libc::unlinkat(dir, tmp.as_ptr(), 0);
            libc::openat(
                dir,
                tmp.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        let written = write_owned(file, bytes, uid).and_then(|()| {
            // SAFETY: both names are valid C strings relative to the open directory.
            if unsafe { libc::renameat(dir, tmp.as_ptr(), dir, target.as_ptr()) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
        if written.is_err() {
            // SAFETY: as above.
            unsafe { libc::unlinkat(dir, tmp.as_ptr(), 0) };
        }
        written
    }

    /// Reads what changed since the last scan, within the bounds. Files named `.…` (a
    /// writer's temporary file) or not ending in `.json` are not looked at.
    pub fn scan(&mut self, now: SystemTime) -> ScanReport {
        let mut report = ScanReport::default();
        let names: Vec<OsString> = match std::fs::read_dir(&self.path) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .filter(|n| {
                    let b = n.as_bytes();
                    !b.starts_with(b".") && b.ends_with(b".json")
                })
                .take(MAX_NAMES_PER_SCAN)
                .collect(),
            Err(err) => {
                tracing::warn!(dir = %self.path.display(), error = %err, "cannot list the job spool");
                return report;
            }
        };
        if names.len() < MAX_NAMES_PER_SCAN {
            let listed: HashSet<&OsString> = names.iter().collect();
            self.seen.retain(|n, _| listed.contains(n));
        }
        let mut per_uid: HashMap<u32, usize> = HashMap::new();
        let mut read = 0usize;
        for name in names {
            let Some(st) = self.lstat(&name) else {
                continue;
            };
            let stamp = Stamp {
                ino: st.st_ino,
                size: st.st_size,
                mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            };
            let mtime = SystemTime::UNIX_EPOCH
                + Duration::from_secs(u64::try_from(st.st_mtime).unwrap_or(0));
            let stale = now.duration_since(mtime).unwrap_or_default() > STALE_AFTER;
            if self.seen.get(&name) == Some(&stamp) {
                if stale {
                    // Read before, never rewritten since: its process is gone.
                    self.remove(&name);
                }
                continue;
            }
            let uid_count = per_uid.entry(st.st_uid).or_default();
            if read >= MAX_FILES_PER_SCAN || *uid_count >= MAX_FILES_PER_UID {
                report.deferred += 1;
                continue;
            }
            read += 1;
            *uid_count += 1;
            let outcome = self.open_entry(&name).and_then(read_checked);
            self.seen.insert(name.clone(), stamp);
            match outcome {
                Ok((file, _)) => report.ingested.push(Ingested { name, file, stale }),
                Err(refusal) => {
                    *self.refusals.entry(refusal.label()).or_default() += 1;
                    tracing::warn!(dir = %self.path.display(), file = ?name, uid = st.st_uid, reason = refusal.label(),
                        "job spool file refused: {refusal}");
                    if !matches!(refusal, Refusal::NotRegular("directory")) {
                        self.remove(&name);
                    }
                    report.refused.push((name, refusal));
                }
            }
        }
        report
    }
}

/// Writes `bytes` to `file`, gives it to `uid` and makes it durable.
fn write_owned(mut file: File, bytes: &[u8], uid: u32) -> std::io::Result<()> {
    use std::io::Write;
    file.write_all(bytes)?;
    // SAFETY: the descriptor is open; a gid of -1 leaves the group as it is.
    if unsafe { libc::fchown(file.as_raw_fd(), uid, u32::MAX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    file.sync_all()
}

#[cfg(test)]
#[path = "ingest_tests.rs"]
pub(crate) mod tests;
