//! Finding CUDA and NCCL at run time, so the agent binary starts on nodes that have
//! neither, and says why NCCL tests cannot run instead of crashing.
//!
//! cudarc loads NCCL by `dlopen("libnccl.so")` (and a few versioned names, but not
//! `libnccl.so.2`), and panics when none loads. Most nodes only have the runtime package,
//! which ships `libnccl.so.2`, and Python wheels keep it in a site-packages folder no
//! loader searches. So: we look for `libnccl.so.2` ourselves (or take the path from
//! `HEDDLE_NCCL_LIBRARY`), and when cudarc would not find it, we put a `libnccl.so`
//! symlink to it in a private temporary folder and re-run the same command with that
//! folder first in `LD_LIBRARY_PATH`. The dynamic loader reads `LD_LIBRARY_PATH` only at
//! process start, hence the re-run rather than a `setenv`.
//!
//! That folder is first in a root process's library path, so whoever can write to it runs
//! code as root: it is created fresh for each run by this process (mode 0700, a random
//! name), its owner and mode are checked, and it is removed after the re-run.
//! A folder at a predictable path in a shared `/tmp` is never used.

use std::ffi::{CStr, OsString};
use std::path::{Path, PathBuf};

use crate::runner::child_env::{self, NCCL_LIBRARY_ENV};

/// Set in the re-run process, so a shim that still does not load cannot loop.
pub const SHIMMED_ENV: &str = "HEDDLE_NCCL_SHIM";

#[derive(Debug)]
pub enum Probe {
    /// cudarc will load NCCL as the process stands.
    Ready,
    /// Re-run with this folder first in `LD_LIBRARY_PATH`.
    NeedsShim { dir: ShimDir, library: PathBuf },
    /// The reason, with what was checked.
    Unavailable(String),
}

/// Checks the driver, the devices and the NCCL library, in that order.
pub fn probe() -> Probe {
    // SAFETY: is_culib_present only tries dlopen on candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Probe::Unavailable(
            "no CUDA driver: libcuda.so.1 cannot be loaded (is the NVIDIA driver installed?)"
                .into(),
        );
    }
    if let Err(e) = cudarc::driver::result::init() {
        return Probe::Unavailable(format!("cuInit failed: {e:?}"));
    }
    match cudarc::driver::result::device::get_count() {
        Ok(0) => return Probe::Unavailable("the CUDA driver reports no device".into()),
        Err(e) => return Probe::Unavailable(format!("cuDeviceGetCount failed: {e:?}")),
        Ok(_) => {}
    }
    probe_nccl(
        std::env::var_os(NCCL_LIBRARY_ENV).map(PathBuf::from),
        std::env::var_os(SHIMMED_ENV).is_some(),
    )
}

/// The NCCL half of [`probe`], separate so it can be tested without a GPU.
pub fn probe_nccl(wanted: Option<PathBuf>, shimmed: bool) -> Probe {
    // SAFETY: only dlopen attempts.
    let cudarc_finds = unsafe { cudarc::nccl::sys::is_culib_present() };
    if shimmed {
        return if cudarc_finds {
            Probe::Ready
        } else {
            Probe::Unavailable(format!(
                "libnccl.so does not load even through the shim folder first in LD_LIBRARY_PATH ({})",
                std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
            ))
        };
    }
    let library = match wanted {
        Some(path) if !path.is_file() => {
            return Probe::Unavailable(format!(
                "{NCCL_LIBRARY_ENV}={} is not a file",
                path.display()
            ));
        }
        Some(path) => path,
        None if cudarc_finds => return Probe::Ready,
        None => match locate("libnccl.so.2") {
            Ok(path) => path,
            Err(why) => {
                return Probe::Unavailable(format!(
                    "libnccl.so.2 not found: {why} (install the NCCL runtime, or set {NCCL_LIBRARY_ENV} to its path)"
                ));
            }
        },
    };
    match shim_dir(&library) {
        Ok(dir) => Probe::NeedsShim { dir, library },
        Err(e) => Probe::Unavailable(format!(
            "cannot prepare a libnccl.so link to {}: {e}",
            library.display()
        )),
    }
}

/// Where the loader finds `name`: load it, then ask which file the symbol came from.
fn locate(name: &str) -> Result<PathBuf, String> {
    // SAFETY: loading NCCL runs no code of ours; its initialisers are benign.
    let lib = unsafe { libloading::Library::new(name) }.map_err(|e| e.to_string())?;
    // SAFETY: only the address is used.
    let sym: libloading::Symbol<'_, *const ()> = unsafe { lib.get(b"ncclGetVersion\0") }
        .map_err(|e| format!("{name} has no ncclGetVersion: {e}"))?;
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    let ok = unsafe { libc::dladdr(*sym as *const libc::c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return Err(format!("dladdr cannot name the file {name} came from"));
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the loader.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    Ok(PathBuf::from(path.to_string_lossy().into_owned()))
}

/// A folder only this process's user can write to, holding `libnccl.so -> library`;
/// removed when dropped.
#[derive(Debug)]
pub struct ShimDir(tempfile::TempDir);

impl ShimDir {
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    pub fn display(&self) -> std::path::Display<'_> {
        self.0.path().display()
    }
}

/// Creates a fresh private folder with a `libnccl.so` link to `library`.
pub fn shim_dir(library: &Path) -> std::io::Result<ShimDir> {
    use std::os::unix::fs::MetadataExt;
    let real = library.canonicalize()?;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("heddle-nccl-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(std::env::temp_dir())?;
    // Created here, 0700, under a name nobody could guess; check rather than trust.
    let meta = std::fs::symlink_metadata(dir.path())?;
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of uid {uid} (mode {:o}, owner {})",
            dir.path().display(),
            meta.mode() & 0o7777,
            meta.uid()
        )));
    }
    std::os::unix::fs::symlink(&real, dir.path().join("libnccl.so"))?;
    Ok(ShimDir(dir))
}

/// Runs this same command again with `dir` first in `LD_LIBRARY_PATH`, feeding `stdin`
/// when given (the test child already consumed its own, which carried its input), and
/// returns its exit status; `dir` is removed afterwards. The re-run gets a cleared
/// environment plus what [`child_env::inherited`] keeps.
pub fn rerun_with_shim(dir: ShimDir, stdin: Option<&[u8]>) -> std::io::Result<i32> {
    use std::io::Write;
    use std::process::Stdio;
    let exe = std::env::current_exe()?;
    let mut path = OsString::from(dir.path().as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = child_env::command(exe);
    cmd.args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(SHIMMED_ENV, dir.path());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes)?;
    }
    let status = child.wait()?;
    drop(dir);
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_override_is_reported_with_its_path() {
        match probe_nccl(Some("/nonexistent/libnccl.so.2".into()), false) {
            Probe::Unavailable(why) => {
                assert!(
                    why.contains("HEDDLE_NCCL_LIBRARY=/nonexistent/libnccl.so.2"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_override_gets_a_private_shim_folder_with_a_link() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("libnccl.so.2");
        std::fs::write(&lib, b"not really a library").unwrap();
        match probe_nccl(Some(lib.clone()), false) {
            Probe::NeedsShim { dir, library } => {
                assert_eq!(library, lib);
                let target = std::fs::read_link(dir.path().join("libnccl.so")).unwrap();
                assert_eq!(target, lib.canonicalize().unwrap());
                let meta = std::fs::symlink_metadata(dir.path()).unwrap();
                assert_eq!(meta.mode() & 0o777, 0o700);
                // A fresh folder each time, gone once dropped.
                let again = shim_dir(&lib).unwrap();
                assert_ne!(again.path(), dir.path());
                let path = dir.path().to_path_buf();
                drop(dir);
                assert!(!path.exists());
            }
            other => panic!("{other:?}"),
        }
    }

    /// The folder the loader used to take: `$TMPDIR/heddle-nccl-<uid>-<hash of the
    /// library's path>`, accepted if it already existed. Anyone who can write to `/tmp`
    /// could make it first (or make it a symlink to a folder of theirs) and have root load
    /// their `libnccl.so`.
    #[test]
    fn shim_dir_at_old_tmp_path_is_not_trusted() {
        use sha2::Digest;
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp.path().join("libnccl.so.2");
        std::fs::write(&lib, b"the real library").unwrap();
        let real = lib.canonicalize().unwrap();
        let tag = hex::encode(&sha2::Sha256::digest(real.as_os_str().as_encoded_bytes())[..8]);
        let uid = unsafe { libc::getuid() };
        let old = std::env::temp_dir().join(format!("heddle-nccl-{uid}-{tag}"));
        // The attacker's folder, with their library, linked at the old path.
        let attacker = tempfile::tempdir().unwrap();
        std::fs::write(attacker.path().join("libnccl.so"), b"evil").unwrap();
        let _ = std::fs::remove_file(&old);
        std::os::unix::fs::symlink(attacker.path(), &old).unwrap();

        let probed = probe_nccl(Some(lib.clone()), false);
        let _ = std::fs::remove_file(&old);
        let Probe::NeedsShim { dir, .. } = probed else {
            panic!("{probed:?}")
        };
        assert_ne!(dir.path(), old.as_path());
        let canonical = dir.path().canonicalize().unwrap();
        assert!(!canonical.starts_with(attacker.path().canonicalize().unwrap()));
        assert_eq!(
            std::fs::read_link(dir.path().join("libnccl.so")).unwrap(),
            real
        );
        let meta = std::fs::symlink_metadata(dir.path()).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.uid(), unsafe { libc::geteuid() });
        assert_eq!(meta.mode() & 0o077, 0);
        // The attacker's folder was not touched either.
        assert_eq!(
            std::fs::read(attacker.path().join("libnccl.so")).unwrap(),
            b"evil"
        );
        assert_eq!(std::fs::read_dir(attacker.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_shim_that_does_not_load_ends_the_search() {
        // On a machine with NCCL in the loader path this is Ready; without, Unavailable.
        let present = unsafe { cudarc::nccl::sys::is_culib_present() };
        match probe_nccl(None, true) {
            Probe::Ready => assert!(present),
            Probe::Unavailable(why) => {
                assert!(!present);
                assert!(why.contains("shim"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
}
