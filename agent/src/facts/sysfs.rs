//! Reading files under a filesystem root, and collecting per-field errors.
//!
//! Every path is relative to the root (`sys/class/net`), so the same collectors read the
//! live machine (`/`) or a fixture tree. Symlinks are resolved lexically *inside* the
//! root: a fixture's `sys/bus/pci/devices/<bdf>` link must land in the fixture's own
//! `sys/devices`, never in the host's.

use std::io;
use std::path::{Component, Path, PathBuf};

use heddle_types::facts::FactError;

/// Why one fact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("cannot parse {path}: {what} (got {value:?})")]
    Parse {
        path: String,
        what: &'static str,
        value: String,
    },
}

impl ReadError {
    /// True when the file simply does not exist, which for most optional facts is not an
    /// error worth reporting.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// A filesystem root plus the errors met while reading it.
#[derive(Debug)]
pub struct Root {
    base: PathBuf,
    /// Where `etc/...` is read instead, e.g. the host's /etc mounted at /host/etc.
    etc: Option<PathBuf>,
    errors: Vec<FactError>,
}

impl Root {
    pub fn new(base: impl Into<PathBuf>) -> Self {
        Root {
            base: base.into(),
            etc: None,
            errors: Vec::new(),
        }
    }

    /// Reads `etc/...` from `dir`: a container's own /etc says nothing about its host.
    pub fn with_etc(mut self, dir: Option<PathBuf>) -> Self {
        self.etc = dir;
        self
    }

    /// True when reading the live machine rather than a copy.
    pub fn is_live(&self) -> bool {
        self.base == Path::new("/")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        let rel = rel.trim_start_matches('/');
        match (&self.etc, rel.strip_prefix("etc/")) {
            (Some(etc), Some(rest)) => etc.join(rest),
            _ => self.base.join(rel),
        }
    }

    /// A path in the root itself even under `etc/`: for what the processes the agent starts
    /// read (they see its own /etc, not the host's).
    pub fn own_path(&self, rel: &str) -> PathBuf {
        self.base.join(rel.trim_start_matches('/'))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    /// Whole file, trailing whitespace trimmed (sysfs values end in a newline).
    pub fn read(&self, rel: &str) -> Result<String, ReadError> {
        let path = self.path(rel);
        let bytes = read_capped(&path).map_err(|source| ReadError::Io {
            path: rel.to_string(),
            source,
        })?;
        let text = String::from_utf8_lossy(&bytes);
        Ok(text
            .trim_end_matches(['\n', '\r', ' ', '\t', '\0'])
            .to_string())
    }

    /// Reads an optional value: a missing file gives `None` silently, any other failure
    /// (permission, EIO, garbage) is recorded against `field` and gives `None`.
    pub fn opt(&mut self, rel: &str, field: &str) -> Option<String> {
        match self.read(rel) {
            Ok(v) if v.is_empty() => None,
            Ok(v) => Some(v),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                self.error(field, e.to_string());
                None
            }
        }
    }

    /// Like [`Root::opt`] but also parses; a parse failure is recorded too.
    pub fn opt_parse<T>(
        &mut self,
        rel: &str,
        field: &str,
        what: &'static str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        let raw = self.opt(rel, field)?;
        match parse(&raw) {
            Some(v) => Some(v),
            None => {
                let e = ReadError::Parse {
                    path: rel.to_string(),
                    what,
                    value: truncate(&raw),
                };
                self.error(field, e.to_string());
                None
            }
        }
    }

    /// Sorted entry names of a directory; a missing directory is an empty list.
    pub fn list(&self, rel: &str) -> Result<Vec<String>, ReadError> {
        let dir = self.path(rel);
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(ReadError::Io {
                    path: rel.to_string(),
                    source,
                });
            }
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_by(|a, b| natural_cmp(a, b));
        Ok(names)
    }

    /// [`Root::list`] that records a failure against `field` and returns an empty list.
    pub fn list_or_record(&mut self, rel: &str, field: &str) -> Vec<String> {
        match self.list(rel) {
            Ok(v) => v,
            Err(e) => {
                self.error(field, e.to_string());
                Vec::new()
            }
        }
    }

    /// Resolves a symlink (and every symlink in its target) lexically inside the root and
    /// returns the root-relative result, e.g. `sys/devices/pci0000:00/0000:00:02.0`.
    pub fn resolve(&self, rel: &str) -> Result<String, ReadError> {
        let mut current: Vec<String> = Vec::new();
        let mut pending: Vec<String> = components(rel).into_iter().rev().collect();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                ".." => {
                    current.pop();
                    continue;
                }
                "." => continue,
                _ => {}
            }
            current.push(part);
            let joined = current.join("/");
            let full = self.path(&joined);
            match std::fs::symlink_metadata(&full) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > 40 {
                        return Err(ReadError::Io {
                            path: rel.to_string(),
                            source: io::Error::other("too many levels of symbolic links"),
                        });
                    }
                    let target = std::fs::read_link(&full).map_err(|source| ReadError::Io {
                        path: joined.clone(),
                        source,
                    })?;
                    current.pop();
                    if target.is_absolute() {
                        current.clear();
                    }
                    for c in components(&target.to_string_lossy()).into_iter().rev() {
                        pending.push(c);
                    }
                }
                Ok(_) => {}
                Err(source) => {
                    return Err(ReadError::Io {
                        path: rel.to_string(),
                        source,
                    });
                }
            }
        }
        Ok(current.join("/"))
    }

    /// Last component of a symlink's target (`driver` → `mlx5_core`), `None` if absent.
    pub fn link_name(&self, rel: &str) -> Option<String> {
        let target = std::fs::read_link(self.path(rel)).ok()?;
        target.file_name().map(|n| n.to_string_lossy().into_owned())
    }

    pub fn error(&mut self, field: &str, message: impl Into<String>) {
        self.errors.push(FactError {
            field: field.to_string(),
            message: message.into(),
        });
    }

    pub fn take_errors(&mut self) -> Vec<FactError> {
        std::mem::take(&mut self.errors)
    }
}

/// Largest file the collector reads whole. A sysfs attribute is at most a page and the
/// procfs files read are a few KiB; a fixture tree, a container's fake `/proc` or a
/// config file can be anything, so a larger file is refused rather than read.
pub const MAX_READ: u64 = 1 << 20;

/// `std::fs::read`, refusing a file larger than [`MAX_READ`] (and never reading more).
pub fn read_capped(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_READ + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_READ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_READ} bytes"),
        ));
    }
    Ok(bytes)
}

fn components(path: &str) -> Vec<String> {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".to_string()),
            _ => None,
        })
        .collect()
}

fn truncate(s: &str) -> String {
    if s.len() <= 64 {
        return s.to_string();
    }
    let mut end = 64;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Orders `mlx5_10` after `mlx5_2` and `node10` after `node2`, the way people read them.
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    let (ca, cb) = (chunks(a), chunks(b));
    for ((da, xa), (db, xb)) in ca.iter().zip(cb.iter()) {
        let ord = if *da && *db {
            let (ta, tb) = (xa.trim_start_matches('0'), xb.trim_start_matches('0'));
            ta.len()
                .cmp(&tb.len())
                .then_with(|| ta.cmp(tb))
                .then_with(|| xa.len().cmp(&xb.len()))
        } else {
            xa.cmp(xb)
        };
        if ord != std::cmp::Ordering::Equal {
            return ord;
        }
    }
    ca.len().cmp(&cb.len())
}

/// Parses kernel list syntax (`0-19,40-59`) into a CPU count.
pub fn cpulist_count(list: &str) -> Option<u32> {
    let list = list.trim();
    if list.is_empty() {
        return Some(0);
    }
    let mut count = 0u32;
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a {
                    return None;
                }
                count += b - a + 1;
            }
            None => {
                part.trim().parse::<u32>().ok()?;
                count += 1;
            }
        }
    }
    Some(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist_counts_ranges_and_singles() {
        assert_eq!(cpulist_count("0-19,40-59"), Some(40));
        assert_eq!(cpulist_count("3"), Some(1));
        assert_eq!(cpulist_count(""), Some(0));
        assert_eq!(cpulist_count("5-2"), None);
        assert_eq!(cpulist_count("zero"), None);
    }

    #[test]
    fn natural_order_puts_10_after_2() {
        let mut v = vec!["mlx5_10", "mlx5_2", "mlx5_bond_0", "mlx5_0"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["mlx5_0", "mlx5_2", "mlx5_10", "mlx5_bond_0"]);
    }

    #[test]
    fn resolve_stays_inside_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sys/devices/pci0000:00/0000:00:02.0")).unwrap();
        std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:02.0",
            root.join("sys/bus/pci/devices/0000:00:02.0"),
        )
        .unwrap();
        // An absolute link is re-rooted, and `..` cannot climb above the root.
        std::os::unix::fs::symlink(
            "/../../sys/devices/pci0000:00",
            root.join("sys/bus/pci/devices/abs"),
        )
        .unwrap();
        let r = Root::new(root);
        assert_eq!(
            r.resolve("sys/bus/pci/devices/0000:00:02.0").unwrap(),
            "sys/devices/pci0000:00/0000:00:02.0"
        );
        assert_eq!(
            r.resolve("sys/bus/pci/devices/abs").unwrap(),
            "sys/devices/pci0000:00"
        );
        assert!(
            r.resolve("sys/bus/pci/devices/missing")
                .unwrap_err()
                .is_not_found()
        );
    }

    #[test]
    fn opt_records_errors_but_not_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("num"), "garbage\n").unwrap();
        std::fs::create_dir(dir.path().join("adir")).unwrap();
        let mut r = Root::new(dir.path());
        assert_eq!(r.opt("absent", "/a"), None);
        assert_eq!(
            r.opt_parse("num", "/num", "an integer", |s| s.parse::<u32>().ok()),
            None
        );
        assert_eq!(r.opt("adir", "/dir"), None);
        let errors = r.take_errors();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].field, "/num");
        assert!(
            errors[0].message.contains("an integer"),
            "{}",
            errors[0].message
        );
        assert_eq!(errors[1].field, "/dir");
    }
}
