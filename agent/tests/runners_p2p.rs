//! The `p2p` runner: on a node without CUDA the bench command and the job child say why
//! and the job ends `skipped`; on a GPU node the same tests check the measured figures.
//! A real capture (`heddle-agent bench p2p --json` on an H100) checks that the summary's
//! matrices and the printed tables follow from the rows.

use std::io::Write;
use std::process::{Command, Stdio};

use heddle_agent::runner::p2p;
use heddle_testkit::files::has_cuda;
use heddle_types::jobs::ResultRow;

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

fn child(params: serde_json::Value) -> (std::process::Output, Vec<serde_json::Value>) {
    let input = serde_json::json!({
        "kind": "p2p", "params": params,
        "job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(), "rank": 0, "world_size": 1,
    });
    let mut c = Command::new(BIN)
        .arg("child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = c.wait_with_output().unwrap();
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (out, events)
}

#[test]
fn job_child_without_cuda_is_skipped_with_the_reason() {
    let (out, events) = child(serde_json::json!({"size": 1 << 20, "iters": 2}));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    if has_cuda() {
        // A GPU node: rows for every pair and host direction, then the summary.
        let rows: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["event"] == "row")
            .map(|e| &e["row"])
            .collect();
        assert!(!rows.is_empty(), "{events:?}");
        for r in &rows {
            assert_eq!(r["wrong"], 0, "{r}");
            assert!(r["algbw_gbs"].as_f64().unwrap() > 0.0, "{r}");
        }
        assert!(events.last().unwrap()["event"] == "summary");
        return;
    }
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "skipped");
    assert_eq!(
        events[0]["reason"],
        "CUDA unavailable: libcuda.so not found (is the NVIDIA driver installed?)"
    );
}

#[test]
fn job_child_rejects_bad_params_before_touching_cuda() {
    let (out, events) = child(serde_json::json!({"size": 0}));
    assert!(!out.status.success());
    assert!(events.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("params.size: must be in"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bench_says_why_cuda_is_unavailable() {
    if has_cuda() {
        return;
    }
    let out = Command::new(BIN)
        .args(["bench", "p2p", "-s", "64M"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("CUDA unavailable: libcuda.so not found"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    let out = Command::new(BIN)
        .args(["bench", "p2p", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["skipped"]
            .as_str()
            .unwrap()
            .starts_with("CUDA unavailable: "),
        "{v}"
    );
    let out = Command::new(BIN)
        .args(["bench", "p2p", "-n", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "0 iterations accepted");
}

#[test]
fn real_h100_capture_summary_follows_its_rows() {
    let path = format!(
        "{}/tests/captures/heddle_bench_p2p_1xh100.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let rows: Vec<ResultRow> = serde_json::from_value(v["rows"].clone()).unwrap();
    let summary = v["summary"].as_object().unwrap();
    assert_eq!(summary["gpus"][0]["name"], "NVIDIA H100 80GB HBM3");
    let kinds: Vec<(&str, &str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r.labels["kind"].as_str(),
                r.labels["src"].as_str(),
                r.labels["dst"].as_str(),
                r.labels["path"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("d2d", "0", "0", "local"),
            ("h2d", "host", "0", "pinned"),
            ("d2h", "0", "host", "pinned")
        ]
    );
    for r in &rows {
        assert_eq!(r.wrong, Some(0));
        assert!(
            (r.algbw_gbs.unwrap() - p2p::gbs(r.size_bytes as u64, r.time_us.unwrap())).abs() < 1e-9
        );
    }
    let again = p2p::summarize(&rows, &[0]);
    for key in ["d2d_gbs", "d2d_paths", "h2d_gbs", "d2h_gbs", "wrong"] {
        assert_eq!(again[key], summary[key], "{key}");
    }
    // HBM3 device copy well above PCIe, host copies at PCIe Gen5 x16 speed.
    assert!(summary["d2d_gbs"][0][0].as_f64().unwrap() > 1000.0);
    assert!((40.0..64.0).contains(&summary["h2d_gbs"][0].as_f64().unwrap()));
    insta::assert_snapshot!("runners_p2p_table_1xh100", p2p::render(summary));
}
