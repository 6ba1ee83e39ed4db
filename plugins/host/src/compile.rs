//! Turning component bytes into native code: bounded in time, and cached on local disk so a
//! large component (CPython is 18 MB of WebAssembly) is compiled once per version, not once
//! per process.
//!
//! The disk cache holds wasmtime's serialised components, which are native code that
//! `Component::deserialize` trusts blindly. So entries are only ever written by this process
//! from bytes it compiled itself, named by the sha256 of those bytes and of the engine's
//! configuration, and only read from a directory that belongs to this user and that nobody
//! else can write to (mode 0700). Bytes from the network are always compiled, never
//! deserialised; what comes back from the disk is what this host wrote for the same bytes.

use std::fs::DirBuilder;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::HostError;

/// Where a compiled component came from, and what it cost.
pub struct Compiled {
    pub component: Component,
    /// Time spent compiling, or loading from the disk cache.
    pub micros: u64,
    pub from_disk: bool,
}

/// Compiles `bytes`, or loads what an earlier process compiled from them, within `limit`.
pub fn compile(
    engine: &Engine,
    bytes: &[u8],
    sha256: &[u8; 32],
    limit: Duration,
    disk: Option<&DiskCache>,
) -> Result<Compiled, HostError> {
    let started = Instant::now();
    let entry = disk.map(|d| d.entry(engine, sha256));
    if let Some(component) = entry.as_ref().and_then(|e| e.load(engine)) {
        return Ok(Compiled {
            component,
            micros: started.elapsed().as_micros() as u64,
            from_disk: true,
        });
    }
    let component = compile_within(engine, bytes, limit, entry)?;
    Ok(Compiled {
        component,
        micros: started.elapsed().as_micros() as u64,
        from_disk: false,
    })
}

/// Cranelift cannot be interrupted, so compilation runs on a thread of its own and the caller
/// stops waiting at `limit`. The thread finishes in the background (its work is bounded by the
/// component size cap) and still stores what it compiled in the disk cache, so a later try
/// finds it there.
fn compile_within(
    engine: &Engine,
    bytes: &[u8],
    limit: Duration,
    entry: Option<Entry>,
) -> Result<Component, HostError> {
    let (tx, rx) = mpsc::sync_channel(1);
    let engine = engine.clone();
    let owned = bytes.to_vec();
    std::thread::Builder::new()
        .name("heddle-plugin-compile".into())
        .spawn(move || {
            // Only ever compiled from wasm bytes: see the module docs.
            let compiled = Component::from_binary(&engine, &owned);
            if let (Ok(component), Some(entry)) = (&compiled, entry) {
                entry.store(component);
            }
            let _ = tx.send(compiled);
        })
        .map_err(|e| HostError::Unavailable(format!("no thread to compile on: {e}")))?;
    match rx.recv_timeout(limit) {
        Ok(Ok(component)) => Ok(component),
        Ok(Err(e)) => Err(HostError::NotAComponent(format!("{e:#}"))),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(HostError::CompileTimeout {
            limit_ms: limit.as_millis().try_into().unwrap_or(u64::MAX),
        }),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(HostError::Internal("the compiler thread died".into()))
        }
    }
}

/// A private directory of compiled components.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// Creates `dir` (mode 0700) if needed. `None`, with a warning, when it is not a directory
    /// that only this user can write to: the host then compiles every time.
    pub fn open(dir: &Path) -> Option<Self> {
        if let Err(e) = DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the plugin compile cache; compiling every time");
            return None;
        }
        match private(dir) {
            Ok(()) => Some(Self {
                dir: dir.to_path_buf(),
            }),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), "not using the plugin compile cache: {why}; compiling every time");
                None
            }
        }
    }

    fn entry(&self, engine: &Engine, sha256: &[u8; 32]) -> Entry {
        // The engine's settings (compiler flags, features, wasmtime version) decide whether
        // compiled code fits it; wasmtime checks them again when deserialising.
        let mut h = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        Entry {
            dir: self.dir.clone(),
            path: self
                .dir
                .join(format!("{}-{:016x}.cwasm", hex::encode(sha256), h.finish())),
        }
    }
}

/// Refuses directories (and files) someone else owns or could write to.
fn private(path: &Path) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!("owned by uid {}, not {me}", meta.uid()));
    }
    if meta.file_type().is_symlink() {
        return Err("a symbolic link".into());
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "writable by others (mode {:o})",
            meta.permissions().mode() & 0o777
        ));
    }
    Ok(())
}

struct Entry {
    dir: PathBuf,
    path: PathBuf,
}

impl Entry {
    fn load(&self, engine: &Engine) -> Option<Component> {
        if !self.path.exists() {
            return None;
        }
        if let Err(why) = private(&self.dir).and_then(|()| private(&self.path)) {
            tracing::warn!(path = %self.path.display(), "ignoring cached compiled plugin: {why}");
            return None;
        }
        // Read into memory rather than mapped: a mapping of a file someone truncates later
        // would crash the process (SIGBUS) at the next call.
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read cached compiled plugin; recompiling");
                return None;
            }
        };
        // SAFETY: the file is in a directory only this user can write to, under the name of
        // the sha256 of the bytes this host compiled it from and of this engine's settings;
        // it was written by `store` below, never taken from input (see the module docs).
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %format!("{e:#}"), "cached compiled plugin unusable; recompiling");
                let _ = std::fs::remove_file(&self.path);
                None
            }
        }
    }

    /// Best effort: a failure to write costs a compile next time, nothing else.
    fn store(&self, component: &Component) {
        let written = component
            .serialize()
            .map_err(|e| format!("{e:#}"))
            .and_then(|bytes| {
                let mut tmp =
                    tempfile::NamedTempFile::new_in(&self.dir).map_err(|e| e.to_string())?;
                tmp.write_all(&bytes).map_err(|e| e.to_string())?;
                tmp.as_file().sync_all().map_err(|e| e.to_string())?;
                tmp.persist(&self.path).map_err(|e| e.to_string())?;
                Ok(())
            });
        if let Err(e) = written {
            tracing::warn!(path = %self.path.display(), error = %e, "could not cache the compiled plugin");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_dir_others_can_write_is_not_used() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("cache");
        assert!(DiskCache::open(&dir).is_some());
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(DiskCache::open(&dir).is_none());
        let link = base.path().join("link");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(private(&link).is_err());
    }
}
