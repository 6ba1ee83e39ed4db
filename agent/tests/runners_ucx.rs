//! UCX and RDMA runners: parsers snapshot-tested on real captures, a real `ucx_perftest`
//! run over loopback through the job child (when UCX's tools are installed), and the
//! RDMA skip path on a node without an HCA.

use std::io::Write;
use std::process::{Command, Stdio};

use heddle_agent::runner::{rdma, ucx, ucx_parse};
use heddle_testkit::files::capture;

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

fn child(
    kind: &str,
    params: serde_json::Value,
    env: &[(&str, &str)],
) -> (bool, Vec<serde_json::Value>, String) {
    let input = serde_json::json!({
        "kind": kind, "params": params, "job_id": uuid::Uuid::nil(), "run_id": uuid::Uuid::nil(),
        "rank": 0, "world_size": 1,
    });
    let mut cmd = Command::new(BIN);
    cmd.arg("child")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut c = cmd.spawn().unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = c.wait_with_output().unwrap();
    let events = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        out.status.success(),
        events,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ucx_info_devices_new_layout() {
    let t = ucx_parse::parse_info_devices(&capture("ucx_info_d_loopback.txt"));
    insta::assert_json_snapshot!("runners_ucx_info_d_loopback", t);
}

#[test]
fn ucx_info_devices_old_layout_with_rc_and_cuda() {
    let mut t = ucx_parse::parse_info_devices(&capture("ucx_info_d_seed000_rc.txt"));
    t.extend(ucx_parse::parse_info_devices(&capture(
        "ucx_info_d_seed000_cuda.txt",
    )));
    insta::assert_json_snapshot!("runners_ucx_info_d_seed000", t);
}

#[test]
fn ucx_perftest_tables() {
    for name in [
        "ucx_perftest_tag_bw.txt",
        "ucx_perftest_tag_lat.txt",
        "ucx_perftest_ucp_put_bw.txt",
    ] {
        let r = ucx_parse::parse_perftest(&capture(name)).unwrap();
        insta::assert_json_snapshot!(format!("runners_{}", name.trim_end_matches(".txt")), r);
    }
    // The server side prints only the test description.
    assert!(ucx_parse::parse_perftest(&capture("ucx_perftest_server_tag_lat.txt")).is_err());
    assert_eq!(
        ucx_parse::parse_version(&capture("ucx_info_v.txt")).as_deref(),
        Some("1.13.1")
    );
}

#[test]
fn ucx_perftest_really_runs_over_loopback() {
    if ucx::which("ucx_perftest").is_none() {
        eprintln!("SKIPPED: ucx_perftest is not installed (apt-get install ucx-utils)");
        let (ok, events, _) = child("ucx", serde_json::json!({}), &[]);
        assert!(ok);
        assert_eq!(events[0]["event"], "skipped");
        return;
    }
    let (ok, events, stderr) = child(
        "ucx",
        serde_json::json!({"tests": ["tag_lat", "tag_bw"], "sizes": [8, 65536], "iters": 2000, "warmup": 100}),
        &[],
    );
    assert!(ok, "{stderr}");
    let rows: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "row")
        .map(|e| &e["row"])
        .collect();
    assert_eq!(rows.len(), 4, "{events:?}");
    for r in &rows {
        assert!(r["time_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["algbw_gbs"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["extra"]["iterations"], 2000);
    }
    assert_eq!(rows[0]["extra"]["time_metric"], "latency");
    assert_eq!(rows[2]["extra"]["time_metric"], "overhead");
    let summary = &events.iter().find(|e| e["event"] == "summary").unwrap()["summary"];
    assert!(summary["ucx_version"].is_string());
    assert!(
        summary["ucx_transports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t.as_str().unwrap().starts_with("tcp/"))
    );
}

fn fixture_facts(name: &str) -> heddle_types::facts::NodeFacts {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    heddle_agent::facts::collect(&heddle_agent::facts::CollectOptions::for_root(root))
}

/// Debian's ucx-utils has no verbs transports (tcp and shared memory only): a real run
/// over loopback, UCX's own choice and forced onto tcp, judged against a node with ACTIVE
/// InfiniBand ports (dgx1: `ucx-no-rdma` fails) and one without an HCA (no failure).
#[test]
fn a_real_ucx_run_is_judged_against_the_facts() {
    use heddle_types::transport::{Level, UcxEvidence, classify_ucx};
    if ucx::which("ucx_perftest").is_none() {
        eprintln!("SKIPPED: ucx_perftest is not installed (apt-get install ucx-utils)");
        return;
    }
    let (ib, bare) = (fixture_facts("dgx1"), fixture_facts("ethernet-box"));
    assert!(!heddle_types::transport::active_ports(&ib).is_empty());
    for (env, forced_tcp) in [(vec![], false), (vec![("UCX_TLS", "tcp")], true)] {
        let (ok, events, stderr) = child(
            "ucx",
            serde_json::json!({"tests": ["tag_lat"], "sizes": [8], "iters": 200, "warmup": 10}),
            &env,
        );
        assert!(ok, "{stderr}");
        let summary = &events.iter().find(|e| e["event"] == "summary").unwrap()["summary"];
        let ev: UcxEvidence = serde_json::from_value(summary["ucx_evidence"].clone()).unwrap();
        assert!(!ev.available.is_empty(), "{summary}");
        assert!(
            !ev.available
                .iter()
                .any(|t| heddle_types::transport::is_verbs_transport(t)),
            "Debian's UCX has no verbs transport: {:?}",
            ev.available
        );
        if forced_tcp {
            assert!(ev.selected.iter().any(|t| t.starts_with("tcp/")), "{ev:?}");
        }
        let on_ib = classify_ucx(Some(&ev), Some(&ib));
        assert!(
            on_ib
                .iter()
                .any(|f| f.code == "ucx-no-rdma" && f.level == Level::Fail),
            "{env:?}: {on_ib:?}"
        );
        let on_bare = classify_ucx(Some(&ev), Some(&bare));
        assert!(
            on_bare.iter().all(|f| f.level != Level::Fail),
            "{env:?}: {on_bare:?}"
        );
        if forced_tcp {
            assert!(
                on_bare.is_empty(),
                "tcp is the only path there: {on_bare:?}"
            );
        }
    }
}

#[test]
fn rdma_job_without_hca_is_skipped_with_evidence() {
    let empty = tempfile::tempdir().unwrap();
    let (ok, events, _) = child(
        "rdma",
        serde_json::json!({"test": "ib_write_bw"}),
        &[(rdma::SYSFS_ENV, empty.path().to_str().unwrap())],
    );
    assert!(ok);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["event"], "skipped");
    let reason = events[0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("no RDMA device: "), "{reason}");
    assert!(reason.contains("class/infiniband is absent"), "{reason}");
}

#[test]
fn rdma_job_on_this_node() {
    // The real /sys: on a node with an HCA this runs perftest; without, it is a skip.
    let (ok, events, stderr) = child(
        "rdma",
        serde_json::json!({"size": 65536, "all": false, "iters": 1000}),
        &[],
    );
    if std::path::Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        assert!(ok, "{stderr}");
    } else {
        assert!(ok);
        assert_eq!(events[0]["event"], "skipped", "{events:?}");
    }
}
