//! What the host's test binaries share: built components, fixtures, hostile facts.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

pub use heddle_testkit::files::{dist, plugin_fixture as fixture};

/// Facts that make `misbehave` (and `py-misbehave`) do `mode`.
pub fn hostile(mode: &str) -> String {
    format!(r#"{{"hostile": "{mode}", "host": {{"hostname": "n1"}}}}"#)
}

/// Runs `f` on a thread and fails the test, instead of hanging it, when `f` is still running
/// after `patience`.
pub fn within<T: Send + 'static>(patience: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(patience)
        .unwrap_or_else(|_| panic!("still running after {patience:?}: the host is stalled"))
}

/// A compile cache shared by the test binaries (and kept between runs, like a node's).
pub fn compile_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("heddle-compiled-plugins")
}
