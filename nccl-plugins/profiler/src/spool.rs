//! Writing the process's spool file: one file per process, `<pid>-<start ticks>.json` in
//! the spool directory, replaced atomically. The directory is opened once and every name
//! is resolved relative to it; the temporary file is created exclusively, never through a
//! symbolic link, readable only by its owner (the root agent checks that owner against
//! the uid inside).

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use heddle_types::observe::{MAX_SPOOL_FILE_LEN, SpoolFile};

pub struct SpoolDir {
    dir: OwnedFd,
    name: CString,
    temp: CString,
}

impl SpoolDir {
    /// Opens the directory the files go to; fails when it is missing or not a directory.
    pub fn open(path: &Path, pid: u32, start_ticks: u64) -> io::Result<SpoolDir> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: NUL-terminated path; the descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = format!("{pid}-{start_ticks}.json");
        Ok(SpoolDir {
            dir,
            temp: CString::new(format!(".{name}.tmp")).expect("no NUL"),
            name: CString::new(name).expect("no NUL"),
        })
    }

    pub fn file_name(&self) -> &str {
        self.name.to_str().unwrap_or("")
    }

    /// Replaces the spool file with `bytes`: write a private temporary file beside it,
    /// flush it to disk, rename it over the old one.
    pub fn replace(&self, bytes: &[u8]) -> io::Result<()> {
        let dir = self.dir.as_raw_fd();
        let open = || {
            // SAFETY: `dir` is open, the name NUL-terminated.
            unsafe {
                libc::openat(
                    dir,
                    self.temp.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600 as libc::c_uint,
                )
            }
        };
        let mut fd = open();
        if fd < 0 && io::Error::last_os_error().kind() == io::ErrorKind::AlreadyExists {
            // Left by a write this process did not finish (it was killed mid-way): only
            // this process writes this name.
            // SAFETY: as above.
            unsafe { libc::unlinkat(dir, self.temp.as_ptr(), 0) };
            fd = open();
        }
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor, owned by the File from here on.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        let written = file.write_all(bytes).and_then(|()| file.sync_data());
        drop(file);
        let renamed = written.and_then(|()| {
            // SAFETY: both names NUL-terminated, relative to the open directory.
            let rc = unsafe { libc::renameat(dir, self.temp.as_ptr(), dir, self.name.as_ptr()) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
        if renamed.is_err() {
            // SAFETY: as above.
            unsafe { libc::unlinkat(dir, self.temp.as_ptr(), 0) };
        }
        renamed
    }
}

/// The file's bytes, within `MAX_SPOOL_FILE_LEN`: when the communicators' rows would not
/// fit, the last registered communicators are left out and counted in `dropped_comms`.
pub fn encode(mut file: SpoolFile) -> Vec<u8> {
    loop {
        let bytes = serde_json::to_vec(&file).unwrap_or_default();
        if bytes.len() <= MAX_SPOOL_FILE_LEN || file.comms.is_empty() {
            return bytes;
        }
        // Drop about as many communicators as the excess takes, at least one.
        let per_comm = bytes.len() / file.comms.len();
        let drop = ((bytes.len() - MAX_SPOOL_FILE_LEN) / per_comm.max(1) + 1).min(file.comms.len());
        file.comms.truncate(file.comms.len() - drop);
        file.dropped_comms += drop as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn replaces_atomically_and_privately() {
        let dir = tempfile::tempdir().unwrap();
        let spool = SpoolDir::open(dir.path(), 42, 7).unwrap();
        assert_eq!(spool.file_name(), "42-7.json");
        spool.replace(b"first").unwrap();
        // A leftover temporary file from a killed write does not stop the next one.
        std::fs::write(dir.path().join(".42-7.json.tmp"), b"junk").unwrap();
        spool.replace(b"second").unwrap();
        let path = dir.path().join("42-7.json");
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // SAFETY: getuid cannot fail.
        assert_eq!(meta.uid(), unsafe { libc::getuid() });
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_symlink_in_place_of_the_temporary_file_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(".1-2.json.tmp")).unwrap();
        let spool = SpoolDir::open(dir.path(), 1, 2).unwrap();
        // The stale entry is removed (it is this process's name) and a fresh file made.
        spool.replace(b"data").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(dir.path().join("1-2.json")).unwrap(), b"data");
    }

    #[test]
    fn a_file_too_large_loses_its_last_communicators_and_still_parses() {
        use heddle_types::observe::{
            CommObservation, JobIdentity, MAX_BANDS_PER_COMM, MAX_COMMS, OpBand, SPOOL_FORMAT,
        };
        let band = |i: usize| OpBand {
            func: "ReduceScatter".into(),
            size_band: (i % 64) as u32,
            ops: u64::MAX / 3,
            bytes: u64::MAX / 3,
            time_ns: u64::MAX / 3,
            exec_ops: 1,
            exec_bytes: 1,
            exec_ns: u64::MAX / 3,
            algos: crate::names::ALGOS
                .iter()
                .map(|a| (a.to_string(), u64::MAX / 3))
                .collect(),
            protos: crate::names::PROTOS
                .iter()
                .map(|p| (p.to_string(), u64::MAX / 3))
                .collect(),
            max_channels: 64,
        };
        let comm = |i: usize| CommObservation {
            comm_hash: format!("{i:016x}"),
            name: Some("n".repeat(256)),
            nranks: 8,
            nnodes: 1,
            rank: 0,
            ops: (0..MAX_BANDS_PER_COMM).map(band).collect(),
            net: vec![],
            proxy_ops: 0,
            dropped_events: 0,
            finalized_at: None,
            progress: None,
        };
        let file = SpoolFile {
            format: SPOOL_FORMAT,
            job: JobIdentity {
                pid: 1,
                uid: 1,
                start_ticks: 1,
                slurm_job_id: None,
                slurm_step_id: None,
                k8s_namespace: None,
                k8s_pod: None,
                torchrun_run_id: None,
                comm: None,
            },
            seq: 0,
            is_final: false,
            written_at: chrono::Utc::now(),
            plugin_version: "0".into(),
            nccl_version: None,
            env_applied: None,
            comms: (0..MAX_COMMS).map(comm).collect(),
            dropped_events: 0,
            dropped_comms: 0,
        };
        assert!(serde_json::to_vec(&file).unwrap().len() > MAX_SPOOL_FILE_LEN);
        let bytes = encode(file);
        assert!(bytes.len() <= MAX_SPOOL_FILE_LEN);
        let parsed = SpoolFile::parse(&bytes).unwrap();
        assert!(parsed.comms.len() < MAX_COMMS && !parsed.comms.is_empty());
        assert_eq!(
            parsed.comms.len() as u64 + parsed.dropped_comms,
            MAX_COMMS as u64
        );
        assert_eq!(
            parsed.comms[0].comm_hash, "0000000000000000",
            "the first ones stay"
        );
    }

    #[test]
    fn missing_directory_is_an_error() {
        assert!(SpoolDir::open(Path::new("/nonexistent/heddle/spool"), 1, 2).is_err());
    }
}
