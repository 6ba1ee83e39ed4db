//! The NCCL runner as a node without CUDA or NCCL sees it: the `bench` command and the
//! job child must both say "NCCL unavailable" with the reason, never panic, and the job
//! must end `skipped`. On a GPU node the same tests check the measured path instead.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

/// Whether this machine can run NCCL at all (a driver that loads).
fn has_cuda() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

#[test]
fn bench_says_why_nccl_is_unavailable() {
    let out = Command::new(BIN)
        .args(["bench", "nccl", "all_reduce", "-b", "8", "-e", "8G", "-f", "2", "-g", "2"])
        .env("HEDDLE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("NCCL unavailable: "), "{stderr}");
    if !has_cuda() {
        assert!(stderr.contains("libcuda.so.1"), "{stderr}");
    } else {
        assert!(stderr.contains("/nonexistent/libnccl.so.2"), "{stderr}");
    }
    assert!(out.stdout.is_empty(), "no table without NCCL");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bench_json_reports_the_skip() {
    let out = Command::new(BIN)
        .args(["bench", "nccl", "broadcast", "--json"])
        .env("HEDDLE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["skipped"].as_str().unwrap().starts_with("NCCL unavailable: "), "{v}");
}

#[test]
fn bench_rejects_bad_flags_before_touching_the_gpu() {
    for args in [
        vec!["all_reduce", "-b", "8T"],
        vec!["all_reduce", "-b", "1M", "-e", "1K"],
        vec!["all_reduce", "-d", "float8"],
        vec!["all_reduce", "--nprocs", "2"],
        vec!["gossip"],
    ] {
        let out = Command::new(BIN).arg("bench").arg("nccl").args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
    }
}

#[test]
fn job_child_ends_skipped_with_the_reason() {
    let input = serde_json::json!({
        "kind": "nccl",
        "params": {"op": "all_reduce", "min_bytes": 8, "max_bytes": 1024},
        "job_id": uuid::Uuid::nil(),
        "run_id": uuid::Uuid::nil(),
        "rank": 0,
        "world_size": 1,
    });
    let mut child = Command::new(BIN)
        .arg("child")
        .env("HEDDLE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "skipped");
    assert!(events[0]["reason"].as_str().unwrap().starts_with("NCCL unavailable: "));
}

#[test]
fn job_child_rejects_bad_params_as_a_failure() {
    let input = serde_json::json!({
        "kind": "nccl", "params": {"op": "gossip"},
        "job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(), "rank": 0, "world_size": 1,
    });
    let mut child = Command::new(BIN)
        .arg("child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown collective"));
}
