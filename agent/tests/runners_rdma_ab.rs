//! The `rdma_ab` job child as a node without CUDA or NCCL sees it: it says "NCCL
//! unavailable" with the reason once, before either leg starts, and the job ends
//! `skipped`; a single-rank run is refused as invalid params.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

fn child(input: serde_json::Value) -> Output {
    let mut child = Command::new(BIN)
        .arg("child")
        .env("HEDDLE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn rdma_ab_without_nccl_is_skipped_with_the_reason() {
    let out = child(serde_json::json!({
        "kind": "rdma_ab",
        "params": {"op": "all_reduce", "max_bytes": 1024},
        "job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(), "rank": 0, "world_size": 2,
    }));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "skipped");
    let reason = events[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("NCCL unavailable: "), "{reason}");
    assert!(!reason.contains("leg"), "said once, not per leg: {reason}");
}

#[test]
fn rdma_ab_on_one_rank_is_refused() {
    let out = child(serde_json::json!({
        "kind": "rdma_ab", "params": {},
        "job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(), "rank": 0, "world_size": 1,
    }));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs two ranks or more"), "{stderr}");
}
