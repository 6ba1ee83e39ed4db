//! Files the tests read from the repository: built plugin components, the facts the
//! plugins are tested with, and the agent's captures of real tools' output and fixture
//! trees of real machines.

use std::path::{Path, PathBuf};

/// The repository's root, the folder above this crate's.
pub(crate) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the kit is a folder of the repository")
}

/// A component from `plugins/dist/` (scripts/build-plugins.sh and
/// scripts/build-python-plugin.sh write them).
pub fn dist(name: &str) -> Vec<u8> {
    let path = repo().join("plugins/dist").join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/build-plugins.sh and scripts/build-python-plugin.sh first",
            path.display()
        )
    })
}

/// `plugins/fixtures/<name>`, as text.
pub fn plugin_fixture(name: &str) -> String {
    let path = repo().join("plugins/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Facts of a fixture the plugins are tested with (`plugins/fixtures/<name>.json`).
pub fn fixture_facts(name: &str) -> serde_json::Value {
    serde_json::from_str(&plugin_fixture(&format!("{name}.json"))).unwrap()
}

/// Where a real tool's output is kept: `agent/tests/captures/<name>`.
pub fn capture_path(name: &str) -> PathBuf {
    repo().join("agent/tests/captures").join(name)
}

/// A real tool's output kept in `agent/tests/captures/`.
pub fn capture(name: &str) -> String {
    let path = capture_path(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether this machine can run NCCL at all (a CUDA driver that loads).
#[cfg(feature = "server")]
pub fn has_cuda() -> bool {
    ["libcuda.so.1", "libcuda.so"]
        .iter()
        // SAFETY: loading the driver runs its initialisers, as any CUDA program does.
        .any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

/// A real machine's sysfs and tool outputs, a tree in `agent/tests/fixtures/`.
pub fn agent_fixture(name: &str) -> PathBuf {
    repo().join("agent/tests/fixtures").join(name)
}
