//! Files the CLI replaces whole (the login file, a Slurm job's notes), all one way: a new
//! temporary file beside the name (created exclusively, so never through a link), exactly
//! `mode` whatever the umask, written and fsynced, renamed over the name (which replaces a
//! link there rather than following it), then the directory fsynced. A crash leaves the
//! old file or the whole new one.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // tempfile creates its file 0600 with O_EXCL; the mode is set before anything is written.
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_a_link_instead_of_writing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let name = dir.path().join("notes");
        std::os::unix::fs::symlink(&victim, &name).unwrap();
        write_atomic(&name, b"new", 0o640).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&name).unwrap(), "new");
        let meta = std::fs::symlink_metadata(&name).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary file is left behind");
    }
}
