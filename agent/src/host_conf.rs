//! Managed blocks in host configuration files that libraries read on their own:
//! `/etc/nccl.conf` (every NCCL version reads it) and `/etc/ucx/ucx.conf` (UCX's system
//! configuration). The agent owns only the lines between its two markers; everything else
//! in the file is the admin's and stays byte for byte.
//!
//! A change is written to a temporary file beside the target, given the target's mode and
//! owner, fsynced and renamed over it, so a reader sees the old file or the new one, never
//! half of either. Writing the same block again changes nothing on disk; an empty block
//! removes the markers too. A symbolic link is refused rather than followed: the agent runs
//! as root, and a link placed by someone else would let them choose what root overwrites.
//!
//! Where the block goes follows how each reader resolves a name set twice (see
//! docs/jobs.md): NCCL keeps the first value it reads (`setenv(…, 0)`), so the
//! block goes last and the admin's own lines win; UCX keeps the last one, and from 1.17 on
//! its file has `[section]`s filtered by CPU model whose lines are skipped elsewhere, so the
//! block goes first, before any section, and the admin's own lines still win.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use heddle_types::env_policy;
use heddle_types::nccl_conf::{self, Entry};

pub const BEGIN: &str = "# BEGIN heddle-agent (managed; do not edit)";
pub const END: &str = "# END heddle-agent";
/// Largest host conf file the agent edits; real ones are a few kilobytes.
pub const MAX_FILE_LEN: usize = 1024 * 1024;
/// UCX reads its conf file with inih's 200-byte line buffer (`INI_MAX_LINE`): `fgets` stops
/// after 199 bytes, and the rest of a longer line is read as a line of its own, so a long
/// value can carry a second setting (tests/ucx_conf.rs does it with the real `ucx_info`).
/// A line of 198 bytes and its newline are read together.
pub const UCX_MAX_LINE: usize = 198;

/// Where the block sits in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Before every other line (UCX: before any `[section]`, and the admin's lines win).
    Top,
    /// After every other line (NCCL: the admin's lines are read first and win).
    Bottom,
}

/// What applying a block did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Unchanged,
    Written,
    Removed,
}

#[derive(Debug, thiserror::Error)]
pub enum HostConfError {
    #[error(
        "{0} is a symbolic link; the agent does not follow links when it writes as root \
         (point the flag at the real file instead)"
    )]
    Symlink(PathBuf),
    #[error("{0} is not a regular file")]
    NotRegular(PathBuf),
    #[error("{path} is {len} bytes; the agent edits files of at most {MAX_FILE_LEN} bytes")]
    TooLarge { path: PathBuf, len: u64 },
    #[error("{0} is not UTF-8 text; the agent leaves it alone")]
    NotUtf8(PathBuf),
    #[error(
        "{path} line {line}: a heddle-agent block that does not close, or a second one; \
         remove the lines from {BEGIN:?} to {END:?} by hand and the agent writes it again"
    )]
    Markers { path: PathBuf, line: usize },
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> HostConfError + 'a {
    move |source| HostConfError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// An entry left out of a file, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub file: PathBuf,
    pub name: String,
    pub why: String,
}

/// Puts `body` (lines without their newline) between the markers in `path`, or removes the
/// block when `body` is empty. A missing file is created (mode 0644, with its directory)
/// only when there is something to write.
pub fn apply_block(
    path: &Path,
    placement: Placement,
    body: &[String],
) -> Result<Change, HostConfError> {
    let existing = read_existing(path)?;
    let old = existing.as_ref().map_or("", |(text, _)| text.as_str());
    let (before, after, had_block) = split_block(path, old)?;
    let mut new = String::with_capacity(old.len() + 64 * body.len());
    let block = || {
        let mut b = String::new();
        if !body.is_empty() {
            b.push_str(BEGIN);
            b.push('\n');
            for line in body {
                b.push_str(line);
                b.push('\n');
            }
            b.push_str(END);
            b.push('\n');
        }
        b
    };
    match placement {
        Placement::Top => {
            new.push_str(&block());
            new.push_str(&before);
            new.push_str(&after);
        }
        Placement::Bottom => {
            new.push_str(&before);
            new.push_str(&after);
            if !body.is_empty() && !new.is_empty() && !new.ends_with('\n') {
                new.push('\n');
            }
            new.push_str(&block());
        }
    }
    if new == old {
        return Ok(Change::Unchanged);
    }
    let meta = existing.map(|(_, m)| m);
    write_atomically(path, new.as_bytes(), meta.as_ref())?;
    Ok(if body.is_empty() && had_block {
        Change::Removed
    } else {
        Change::Written
    })
}

/// The file's text and metadata, read without following a link; `None` when it is absent.
fn read_existing(path: &Path) -> Result<Option<(String, std::fs::Metadata)>, HostConfError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path, "reading its metadata")(e)),
        Ok(m) if m.file_type().is_symlink() => return Err(HostConfError::Symlink(path.into())),
        Ok(m) if !m.is_file() => return Err(HostConfError::NotRegular(path.into())),
        Ok(_) => {}
    }
    // O_NOFOLLOW closes the gap between the check above and the open.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                HostConfError::Symlink(path.into())
            } else {
                io(path, "opening it")(e)
            }
        })?;
    let meta = file.metadata().map_err(io(path, "reading its metadata"))?;
    if !meta.is_file() {
        return Err(HostConfError::NotRegular(path.into()));
    }
    if meta.len() > MAX_FILE_LEN as u64 {
        return Err(HostConfError::TooLarge {
            path: path.into(),
            len: meta.len(),
        });
    }
    let mut bytes = Vec::new();
    use std::io::Read;
    file.take(MAX_FILE_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io(path, "reading it"))?;
    let text = String::from_utf8(bytes).map_err(|_| HostConfError::NotUtf8(path.into()))?;
    Ok(Some((text, meta)))
}

/// The text before and after the managed block, and whether there was one.
fn split_block(path: &Path, text: &str) -> Result<(String, String, bool), HostConfError> {
    let mut before = String::new();
    let mut after = String::new();
    // 0: before the block, 1: inside, 2: after.
    let mut state = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.strip_suffix('\n').unwrap_or(line);
        let markers = |line| HostConfError::Markers {
            path: path.into(),
            line,
        };
        match (state, bare) {
            (0, BEGIN) => state = 1,
            (1, END) => state = 2,
            (1, BEGIN) | (2, BEGIN) | (0, END) | (2, END) => return Err(markers(i + 1)),
            (0, _) => before.push_str(line),
            (1, _) => {}
            _ => after.push_str(line),
        }
    }
    if state == 1 {
        return Err(HostConfError::Markers {
            path: path.into(),
            line: text.split_inclusive('\n').count(),
        });
    }
    Ok((before, after, state == 2))
}

fn write_atomically(
    path: &Path,
    bytes: &[u8],
    meta: Option<&std::fs::Metadata>,
) -> Result<(), HostConfError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if meta.is_none() {
        std::fs::create_dir_all(dir).map_err(io(dir, "creating the directory"))?;
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.heddle-"))
        .tempfile_in(dir)
        .map_err(io(dir, "creating a temporary file"))?;
    let mode = meta.map_or(0o644, |m| m.mode() & 0o7777);
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io(path, "setting the mode of its replacement"))?;
    if let Some(m) = meta {
        let f = tmp.as_file();
        let current = f.metadata().map_err(io(path, "reading its replacement"))?;
        if (current.uid(), current.gid()) != (m.uid(), m.gid()) {
            std::os::unix::fs::fchown(f, Some(m.uid()), Some(m.gid()))
                .map_err(io(path, "giving its replacement the file's owner"))?;
            // chown clears set-id bits; put the mode back as it was.
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(io(path, "setting the mode of its replacement"))?;
        }
    }
    tmp.write_all(bytes)
        .map_err(io(path, "writing its replacement"))?;
    tmp.as_file()
        .sync_all()
        .map_err(io(path, "syncing its replacement"))?;
    tmp.persist(path)
        .map_err(|e| io(path, "renaming its replacement over it")(e.error))?;
    // The rename itself reaches the disk with the directory.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The lines of the `/etc/nccl.conf` block: `NCCL_ENV_PLUGIN=<plugin>` when given, and the
/// node's `NCCL_*` values when `values` (for NCCL before 2.28.7, which has no environment
/// plugin). Entries NCCL would not read back whole, or that the policy refuses, are left
/// out with a reason.
pub fn nccl_block(
    file: &Path,
    plugin: Option<&Path>,
    values: bool,
    entries: &[Entry],
) -> (Vec<String>, Vec<Skipped>) {
    let mut out: Vec<Entry> = Vec::new();
    let mut skipped = Vec::new();
    if let Some(plugin) = plugin {
        let value = plugin.to_string_lossy().into_owned();
        match nccl_conf::check_conf_value("NCCL_ENV_PLUGIN", &value) {
            Ok(()) if plugin.is_absolute() => out.push(Entry {
                name: "NCCL_ENV_PLUGIN".into(),
                value,
            }),
            Ok(()) => skipped.push(skip(file, "NCCL_ENV_PLUGIN", "the path is not absolute")),
            Err(why) => skipped.push(skip(file, "NCCL_ENV_PLUGIN", &why)),
        }
    }
    if values {
        for e in entries.iter().filter(|e| e.name.starts_with("NCCL_")) {
            let checked = env_policy::check_var(&e.name, &e.value)
                .map_err(|err| err.to_string())
                .and_then(|()| nccl_conf::check_conf_value(&e.name, &e.value));
            match checked {
                Ok(()) => out.push(e.clone()),
                Err(why) => skipped.push(skip(file, &e.name, &why)),
            }
        }
    }
    let lines = out
        .iter()
        .map(|e| format!("{}={}", e.name, e.value))
        .collect();
    (lines, skipped)
}

/// The lines of the UCX block: the node's `UCX_*` values, each as UCX's ini reader takes
/// it back unchanged (see [`check_ucx_value`]).
pub fn ucx_block(file: &Path, entries: &[Entry]) -> (Vec<String>, Vec<Skipped>) {
    let mut lines = Vec::new();
    let mut skipped = Vec::new();
    for e in entries.iter().filter(|e| e.name.starts_with("UCX_")) {
        let checked = env_policy::check_var(&e.name, &e.value)
            .map_err(|err| err.to_string())
            .and_then(|()| check_ucx_value(&e.name, &e.value));
        match checked {
            Ok(()) => lines.push(format!("{}={}", e.name, e.value)),
            Err(why) => skipped.push(skip(file, &e.name, &why)),
        }
    }
    (lines, skipped)
}

/// Whether UCX's ini reader (inih, as UCX builds it) reads `NAME=value` back as `value`:
/// it strips spaces around the value, starts a comment at a `;` after a space, and splits
/// lines longer than its buffer.
pub fn check_ucx_value(name: &str, value: &str) -> Result<(), String> {
    env_policy::check_value(name, value).map_err(|e| e.to_string())?;
    if value.is_empty() {
        return Err(format!("{name} is empty; UCX would read an empty setting"));
    }
    if value.trim() != value {
        return Err(format!(
            "the value of {name} starts or ends with a space, which UCX strips"
        ));
    }
    if value
        .as_bytes()
        .windows(2)
        .any(|w| w[0].is_ascii_whitespace() && w[1] == b';')
    {
        return Err(format!(
            "the value of {name} has \" ;\", where UCX's reader starts a comment"
        ));
    }
    let len = name.len() + 1 + value.len();
    if len > UCX_MAX_LINE {
        return Err(format!(
            "{name}=… is {len} bytes; UCX reads conf lines of at most {UCX_MAX_LINE} whole"
        ));
    }
    Ok(())
}

fn skip(file: &Path, name: &str, why: &str) -> Skipped {
    Skipped {
        file: file.into(),
        name: name.into(),
        why: why.into(),
    }
}

/// Which host files the agent manages (the `run` flags below).
#[derive(Debug, Clone, clap::Args)]
pub struct HostConfConfig {
    /// Keep a managed block in --nccl-conf: `NCCL_ENV_PLUGIN=` --nccl-env-plugin, and with
    /// --nccl-conf-values the node's NCCL values themselves. Lines outside the block are
    /// never touched.
    #[arg(long, env = "HEDDLE_MANAGE_NCCL_CONF", default_value_t = false)]
    pub manage_nccl_conf: bool,
    /// The NCCL conf file every NCCL version reads.
    #[arg(long, env = "HEDDLE_NCCL_CONF", default_value = "/etc/nccl.conf")]
    pub nccl_conf: PathBuf,
    /// Absolute path of Heddle's NCCL environment plugin (`libnccl-env-heddle.so`) on this
    /// node, named by `NCCL_ENV_PLUGIN` in the managed block (NCCL 2.28.7 and later).
    #[arg(long, env = "HEDDLE_NCCL_ENV_PLUGIN")]
    pub nccl_env_plugin: Option<PathBuf>,
    /// Also write the node's `NCCL_*` values into the block, for NCCL older than 2.28.7,
    /// which has no environment plugin. Values in the process environment or in
    /// `~/.nccl.conf` still win.
    #[arg(long, env = "HEDDLE_NCCL_CONF_VALUES", default_value_t = false)]
    pub nccl_conf_values: bool,
    /// Keep a managed block with the node's `UCX_*` values in --ucx-conf. Variables in a
    /// process's environment still win.
    #[arg(long, env = "HEDDLE_MANAGE_UCX_CONF", default_value_t = false)]
    pub manage_ucx_conf: bool,
    /// UCX's system conf file (the distribution's UCX reads `/etc/ucx/ucx.conf`); for pods,
    /// a `ucx.conf` in the directory they mount, read through `UCX_CONFIG_DIR`.
    #[arg(long, env = "HEDDLE_UCX_CONF", default_value = "/etc/ucx/ucx.conf")]
    pub ucx_conf: PathBuf,
}

/// What one sync did to each managed file, and the entries it left out.
#[derive(Debug, Default)]
pub struct SyncReport {
    pub files: Vec<(PathBuf, Result<Change, HostConfError>)>,
    pub skipped: Vec<Skipped>,
}

impl SyncReport {
    /// One line per change, error and left-out entry.
    pub fn log(&self) {
        for (path, r) in &self.files {
            match r {
                Ok(Change::Unchanged) => {}
                Ok(change) => tracing::info!(path = %path.display(), ?change, "host conf updated"),
                Err(e) => tracing::warn!(error = %e, "host conf not updated"),
            }
        }
        for s in &self.skipped {
            tracing::warn!(file = %s.file.display(), name = %s.name, why = %s.why, "left out of the host conf");
        }
    }

    /// The first file that could not be updated, if any.
    pub fn first_error(&self) -> Option<&HostConfError> {
        self.files.iter().find_map(|(_, r)| r.as_ref().err())
    }
}

/// Brings every managed host conf file in line with the node's entries (the agent's env
/// file, as `nccl_conf::parse` read it). Each file is handled on its own: one that cannot
/// be written does not keep the other from being updated.
pub fn sync_host_confs(cfg: &HostConfConfig, entries: &[Entry]) -> SyncReport {
    let mut report = SyncReport::default();
    if cfg.manage_nccl_conf {
        let (lines, skipped) = nccl_block(
            &cfg.nccl_conf,
            cfg.nccl_env_plugin.as_deref(),
            cfg.nccl_conf_values,
            entries,
        );
        report.skipped.extend(skipped);
        let r = apply_block(&cfg.nccl_conf, Placement::Bottom, &lines);
        report.files.push((cfg.nccl_conf.clone(), r));
    }
    if cfg.manage_ucx_conf {
        let (lines, skipped) = ucx_block(&cfg.ucx_conf, entries);
        report.skipped.extend(skipped);
        let r = apply_block(&cfg.ucx_conf, Placement::Top, &lines);
        report.files.push((cfg.ucx_conf.clone(), r));
    }
    report
}

#[cfg(test)]
mod tests;
