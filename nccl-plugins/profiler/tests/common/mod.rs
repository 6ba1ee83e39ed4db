//! What the tests of the built plugin share: loading it as NCCL does, running a test's
//! body in a child process (the plugin is process-wide state configured from the
//! environment at its first `init`), and reading its spool file back.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use heddle_nccl_profiler::abi::ProfilerV5;
use heddle_nccl_profiler::host::{Host, Op};
use heddle_types::observe::{CommObservation, SpoolFile};

pub const CHILD: &str = "HEDDLE_PROFILER_TEST_CHILD";

/// The cdylib cargo built beside this test (or `HEDDLE_PROFILER_LIB`, e.g. a release build).
pub fn lib_path() -> PathBuf {
    if let Ok(p) = std::env::var("HEDDLE_PROFILER_LIB") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join("libheddle_nccl_profiler.so");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "libheddle_nccl_profiler.so not built next to {}",
        exe.display()
    );
}

/// Loads the plugin; the library stays loaded for the (child) process's life.
pub fn load() -> Host {
    // SAFETY: loading our own plugin; its initialisers only set up statics.
    let lib = unsafe { libloading::Library::new(lib_path()) }.unwrap();
    // SAFETY: libloading gives a data symbol's address as the value: the v5 table.
    let table = unsafe { *lib.get::<*const ProfilerV5>(b"ncclProfiler_v5\0").unwrap() };
    std::mem::forget(lib);
    // SAFETY: loaded for good (forgotten above).
    unsafe { Host::new(table) }
}

/// Runs this test's body in a child process with `env`; in the child, runs `body`.
pub fn in_child(test: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        // Kernel channel events on all the time, so every operation's GPU time is there
        // to count (a test of the sampled default sets its own share).
        .env("HEDDLE_PROFILER_KERNEL", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{test} in a child process failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The spool directory the parent chose (the child's own `tempdir()` is another one).
pub fn spool_env() -> PathBuf {
    std::env::var("HEDDLE_PROFILER_SPOOL").unwrap().into()
}

pub fn spool_file(dir: &Path) -> SpoolFile {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    SpoolFile::parse(&std::fs::read(&files[0]).unwrap()).unwrap()
}

pub fn op(func: &str, count: usize, datatype: &str, algo: &str, exec_ns: u64) -> Op {
    Op {
        func: func.into(),
        count,
        datatype: datatype.into(),
        algo: algo.into(),
        proto: "SIMPLE".into(),
        channels: 4,
        exec_ns,
    }
}

pub fn ok(rcs: Vec<i32>) {
    assert!(rcs.iter().all(|&rc| rc == 0), "{rcs:?}");
}

pub fn comm<'a>(f: &'a SpoolFile, hash: &str) -> &'a CommObservation {
    f.comms.iter().find(|c| c.comm_hash == hash).unwrap()
}

/// (func, band) → (ops, bytes, exec_ops, exec_ns)
pub fn rows(c: &CommObservation) -> BTreeMap<(String, u32), (u64, u64, u64, u64)> {
    c.ops
        .iter()
        .map(|b| {
            (
                (b.func.clone(), b.size_band),
                (b.ops, b.bytes, b.exec_ops, b.exec_ns),
            )
        })
        .collect()
}

/// Builds a stand-in for Heddle's environment plugin: a `libnccl-env-heddle.so` whose
/// `heddle_nccl_env_applied` returns `applied` (or NULL).
pub fn fake_env_plugin(dir: &Path, applied: Option<&str>) -> PathBuf {
    let src = dir.join("fake_env.rs");
    let body = match applied {
        Some(h) => format!("c\"{h}\".as_ptr()"),
        None => "std::ptr::null()".to_string(),
    };
    std::fs::write(
        &src,
        format!(
            "#[unsafe(no_mangle)]\npub extern \"C\" fn heddle_nccl_env_applied() -> *const std::ffi::c_char {{ {body} }}\n"
        ),
    )
    .unwrap();
    let lib = dir.join("libnccl-env-heddle.so");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args(["--edition", "2024", "--crate-type", "cdylib", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}
