//! `heddle-agent detect` with a Python plugin (plugins/template-python, built by
//! scripts/build-python-plugin.sh) on a fixture tree, as a plugin author runs it: accepted at
//! the default size cap, compiled once into the cache directory, and its recommendation in
//! the merged env.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn python_plugin_recommends_the_bond_of_a_fixture_tree() {
    let plugin = repo().join("plugins/dist/template-python.wasm");
    assert!(
        plugin.is_file(),
        "{}: run scripts/build-python-plugin.sh",
        plugin.display()
    );
    let cache = tempfile::tempdir().unwrap();
    let detect = || {
        let out = Command::new(BIN)
            .arg("detect")
            .arg("--root")
            .arg(repo().join("agent/tests/fixtures/ethernet-box"))
            .arg("--no-builtin")
            .arg("--plugin")
            .arg(&plugin)
            .arg("--plugin-cache-dir")
            .arg(cache.path().join("plugins"))
            .args(["--format", "env"])
            // Room for an unoptimised build compiling CPython on a busy machine.
            .args(["--compile-timeout-ms", "900000"])
            .env_remove("HEDDLE_MAX_PLUGIN_BYTES")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(detect(), "export NCCL_SOCKET_IFNAME=bond0\n");
    let cached: Vec<_> = std::fs::read_dir(cache.path().join("plugins"))
        .unwrap()
        .collect();
    assert_eq!(cached.len(), 1, "one compiled component: {cached:?}");
    // The second run loads it instead of compiling, with the same answer.
    assert_eq!(detect(), "export NCCL_SOCKET_IFNAME=bond0\n");
}

#[test]
fn the_size_cap_is_a_setting() {
    let out = Command::new(BIN)
        .args(["detect", "--no-builtin", "--no-plugin-cache"])
        .arg("--facts")
        .arg(repo().join("plugins/fixtures/runai-roce.json"))
        .arg("--plugin")
        .arg(repo().join("plugins/dist/template-python.wasm"))
        .args(["--max-plugin-bytes", "1048576"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"too-large\""), "{stdout}");
}
