//! The NCCL runner as a node without CUDA or NCCL sees it: the `bench` command and the
//! job child must both say "NCCL unavailable" with the reason, never panic, and the job
//! must end `skipped`. On a GPU node the same tests check the measured path instead.

use std::io::Write;
use std::process::{Command, Stdio};

use heddle_testkit::files::{capture, has_cuda};

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

#[test]
fn bench_says_why_nccl_is_unavailable() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "nccl",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "8G",
            "-f",
            "2",
            "-g",
            "2",
        ])
        .env("HEDDLE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 3: could not run here; a script tells it from a pass (0) and from wrong results (1).
    assert_eq!(out.status.code(), Some(3), "{stderr}");
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
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["skipped"]
            .as_str()
            .unwrap()
            .starts_with("NCCL unavailable: "),
        "{v}"
    );
}

#[test]
fn bench_rejects_bad_flags_before_touching_the_gpu() {
    for args in [
        vec!["all_reduce", "-b", "8T"],
        vec!["all_reduce", "-b", "1M", "-e", "1K"],
        vec!["all_reduce", "-d", "float8"],
        vec!["all_reduce", "--nprocs", "2"],
        vec!["all_reduce", "--budget", "soon"],
        vec!["all_reduce", "--budget", "0s"],
        vec!["all_reduce", "-G", "-1"],
        vec!["gossip"],
    ] {
        let out = Command::new(BIN)
            .arg("bench")
            .arg("nccl")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
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
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "skipped");
    assert!(
        events[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("NCCL unavailable: ")
    );
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
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown collective"));
}

/// NCCL 2.28.9's INFO log from one rank of a two-process all_reduce on 2×H200 (NVLink).
#[test]
fn nccl_debug_log_of_a_real_run() {
    let s =
        heddle_agent::runner::nccl::debug::parse(&capture("nccl_debug_info_2proc_rank0_h200.log"));
    insta::assert_json_snapshot!("runners_nccl_debug_2proc_h200", s);
}

/// The table of our own bench on 2×H200 parses back into rows of the same figures, and
/// re-rendering those rows gives the same figures: lossless to two decimals. (The capture
/// predates the nccl-tests 2.19.6 column widths, so fields are compared, not spacing.)
#[test]
fn table_lines_round_trip_a_real_table() {
    use heddle_agent::runner::nccl::table;
    use heddle_types::jobs::ResultRow;
    let text = capture("heddle_bench_all_gather_2xh200.txt");
    let data: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(data.len(), 6, "{text}"); // -b 1K -e 64M -f 8: 1K, 8K, 64K, 512K, 4M, 32M
    let mut rows = Vec::new();
    for l in &data {
        let f: Vec<&str> = l.split_whitespace().collect();
        let mk = |off: usize, in_place: bool| ResultRow {
            size_bytes: f[0].parse().unwrap(),
            count: Some(f[1].parse().unwrap()),
            dtype: Some(f[2].into()),
            op: Some("all_gather".into()),
            root: Some(f[4].parse().unwrap()),
            in_place: Some(in_place),
            time_us: Some(f[off].parse().unwrap()),
            algbw_gbs: Some(f[off + 1].parse().unwrap()),
            busbw_gbs: Some(f[off + 2].parse().unwrap()),
            wrong: Some(f[off + 3].parse().unwrap()),
            labels: Default::default(),
            extra: serde_json::json!({"redop": f[3]}),
        };
        let (oop, ip) = (mk(5, false), mk(9, true));
        assert_eq!(
            table::line(&oop, Some(&ip))
                .split_whitespace()
                .collect::<Vec<_>>(),
            f,
            "{l}"
        );
        // all_gather on 2 ranks: busbw is half of algbw (to the printed precision).
        assert!(
            (oop.busbw_gbs.unwrap() - oop.algbw_gbs.unwrap() / 2.0).abs() <= 0.011,
            "{l}"
        );
        rows.push(oop);
        rows.push(ip);
    }
    insta::assert_snapshot!("runners_nccl_table_all_gather", table::render(&rows));
}

#[test]
fn sweep_job_without_nccl_is_skipped_with_the_reason() {
    let input = serde_json::json!({
        "kind": "sweep",
        "params": {"op": "all_reduce", "max_bytes": 1024, "grid": {"NCCL_ALGO": ["Ring", "Tree"]}},
        "job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(), "rank": 0, "world_size": 1,
    });
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
    let out = child.wait_with_output().unwrap();
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
    assert!(
        events[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("NCCL unavailable: ")
    );
}

/// On a node with a GPU and NCCL (says SKIPPED elsewhere): a real sweep prints
/// nccl-tests' preamble and closing lines, validates every size, and writes nccl-tests'
/// JSON document; the budget and CUDA-graph modes report how they timed each row.
#[test]
fn bench_on_a_gpu_writes_nccl_tests_lines_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("all_reduce.json");
    let out = Command::new(BIN)
        .args([
            "bench",
            "nccl",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "16M",
            "-f",
            "4",
            "-J",
        ])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        eprintln!("SKIPPED bench_on_a_gpu_writes_nccl_tests_lines_and_json: {stderr}");
        return;
    }
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for line in [
        "# Collective test starting: all_reduce_perf",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 16777216 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 1 unalign: 0",
        "# CUDA graphs: sizes up to 1048576 B replayed once from a graph of 20 launches, larger sizes launched one by one (-G 0: every size launched, as nccl-tests by default)",
        "# Using devices",
        "# Out of bounds values : 0 OK",
        "# Collective test concluded: all_reduce_perf",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line}\n{stdout}");
    }
    assert!(stdout.contains("#  Rank  0 Group  0 Pid "), "{stdout}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    // 8 B × 4 up to 16 MiB: 11 sizes, every element right out of place and in place.
    assert_eq!(rows.len(), 11, "{stdout}");
    assert!(rows.iter().all(|f| f[8] == "0" && f[12] == "0"), "{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(doc["version"], 3);
    assert_eq!(doc["results"].as_array().unwrap().len(), 11);
    assert_eq!(doc["out_of_bounds"]["okay"], "true");
    assert!(
        !doc["config"]["devices"][0]["device_info"]
            .as_str()
            .unwrap()
            .is_empty()
    );

    let json_of = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(BIN)
            .args([
                "bench",
                "nccl",
                "all_reduce",
                "-b",
                "8",
                "-e",
                "4M",
                "-f",
                "8",
                "--json",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = json_of(&["--budget", "2s"]);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 7); // 8 B × 8 up to 4 MiB, out of place and in place
    for r in rows {
        let spread = &r["extra"]["spread"];
        assert!(spread["samples"].as_u64().unwrap() >= 1, "{r}");
        let small = r["size_bytes"].as_u64().unwrap() <= 1 << 20;
        assert_eq!(r["extra"]["graph"].as_bool().unwrap_or(false), small, "{r}");
        assert_eq!(r["wrong"], 0, "{r}");
    }
    assert!(
        v["summary"]["first_row_s"].as_f64().unwrap() < 1.0,
        "{}",
        v["summary"]
    );
    let v = json_of(&["-G", "3"]);
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["extra"]["graph"], true, "{r}");
        assert!(r["extra"].get("spread").is_none(), "{r}");
    }
    // Without -G small sizes are graph replays; -G 0 launches every size, as nccl-tests.
    let v = json_of(&[]);
    for r in v["rows"].as_array().unwrap() {
        let small = r["size_bytes"].as_u64().unwrap() <= 1 << 20;
        assert_eq!(r["extra"]["graph"].as_bool().unwrap_or(false), small, "{r}");
    }
    let v = json_of(&["-G", "0"]);
    for r in v["rows"].as_array().unwrap() {
        assert!(r["extra"].get("graph").is_none(), "{r}");
    }
}
