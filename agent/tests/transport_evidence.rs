//! Transport evidence from real logs, judged against real machines' facts: NCCL INFO logs
//! (public ones and this project's own captures, listed in `tests/captures/README.md`),
//! UCX's info log from Debian's ucx-utils, and `heddle-agent check nccl-log` as a
//! process. The rules themselves are unit-tested in `heddle_types::transport`.

use std::process::Command;

use heddle_agent::check::nccl_log_report;
use heddle_agent::facts::{CollectOptions, collect};
use heddle_agent::runner::nccl::evidence;
use heddle_agent::runner::ucx_parse::parse_ep_cfg;
use heddle_testkit::files::{agent_fixture as fixture, capture, capture_path};
use heddle_types::facts::NodeFacts;
use heddle_types::transport::{Level, UcxEvidence, classify_ucx};

/// dgx1: four ACTIVE EDR InfiniBand ports, each on the PCIe switch of two V100s.
fn ib_node() -> NodeFacts {
    collect(&CollectOptions::for_root(fixture("dgx1")))
}

/// ethernet-box: no GPU, no `/sys/class/infiniband`.
fn no_hca() -> NodeFacts {
    collect(&CollectOptions::for_root(fixture("ethernet-box")))
}

/// The codes and levels a log gets on a node.
fn codes(log: &str, facts: &NodeFacts) -> Vec<(String, Level)> {
    nccl_log_report(&capture(log), facts)
        .findings
        .into_iter()
        .map(|f| (f.code, f.level))
        .collect()
}

const LOGS: &[&str] = &[
    "nccl_info_ib_gdrdma_nccl707.log",
    "nccl_info_roce_nccltests185.log",
    "nccl_info_socket_nodevice_nccl952.log",
    "nccl_info_socket_forced_nccl676.log",
    "nccl_info_ib_disabled_nccl1053.log",
    "nccl_info_gdr_disabled_nccl1537.log",
    "nccl_debug_info_1proc_2gpu_h200.log",
    "nccl_debug_info_2proc_rank0_h200.log",
    "nccl_info_1rank_socket_fallback_h100.log",
];

#[test]
fn evidence_of_every_log() {
    for log in LOGS {
        let ev = evidence::parse(&capture(log));
        insta::assert_json_snapshot!(format!("evidence_{log}"), ev);
    }
}

#[test]
fn ib_with_gpudirect_is_the_fast_path() {
    let ev = evidence::parse(&capture("nccl_info_ib_gdrdma_nccl707.log"));
    assert_eq!(ev.network.as_deref(), Some("IB"));
    assert_eq!(ev.gdr, Some(true));
    assert_eq!(ev.devices.len(), 9);
    assert_eq!(ev.devices[7].link_layer.as_deref(), Some("RoCE"));
    assert_eq!(ev.oob.as_deref(), Some("ib8:192.168.1.8<0>"));
    assert_eq!(ev.transports.get("NET/IB"), Some(&12));
    assert!(codes("nccl_info_ib_gdrdma_nccl707.log", &ib_node()).is_empty());
    let roce = evidence::parse(&capture("nccl_info_roce_nccltests185.log"));
    assert_eq!(roce.version.as_deref(), Some("2.19.3+cuda12.3"));
    assert!(roce.warnings[0].contains("ibv_modify_qp"));
    assert!(codes("nccl_info_roce_nccltests185.log", &ib_node()).is_empty());
}

#[test]
fn sockets_on_an_ib_node_fail_and_quote_nccl() {
    let fail = ("socket-fallback".to_string(), Level::Fail);
    for log in [
        "nccl_info_socket_nodevice_nccl952.log",
        "nccl_info_socket_forced_nccl676.log",
        "nccl_info_ib_disabled_nccl1053.log",
        "nccl_debug_info_1proc_2gpu_h200.log",
        "nccl_debug_info_2proc_rank0_h200.log",
        "nccl_info_1rank_socket_fallback_h100.log",
    ] {
        assert_eq!(codes(log, &ib_node()), std::slice::from_ref(&fail), "{log}");
        assert!(
            codes(log, &no_hca()).is_empty(),
            "{log} on a node without HCA"
        );
    }
    let r = nccl_log_report(
        &capture("nccl_info_socket_nodevice_nccl952.log"),
        &ib_node(),
    );
    let f = &r.findings[0];
    assert!(
        f.reason.contains("NET/IB : No device found."),
        "{}",
        f.reason
    );
    assert!(f.evidence.as_deref().unwrap().contains("via NET/Socket/0"));
    let r = nccl_log_report(&capture("nccl_info_ib_disabled_nccl1053.log"), &ib_node());
    assert!(r.findings[0].reason.contains("NCCL_IB_DISABLE=1 is set"));
}

/// The H100 machine has no HCA: NCCL 2.28.3 says so and uses sockets. On a node whose
/// facts show ACTIVE ports that is the slow path; on that machine it is the only one.
#[test]
fn the_h100_machines_own_fallback() {
    let log = capture("nccl_info_1rank_socket_fallback_h100.log");
    let ev = evidence::parse(&log);
    assert_eq!(ev.network.as_deref(), Some("Socket"));
    assert_eq!(ev.version.as_deref(), Some("2.28.3+cuda13.0"));
    assert_eq!(ev.oob.as_deref(), Some("eth0:192.0.2.2<0>"));
    assert!(ev.devices.is_empty());
    assert_eq!(
        ev.ib_unavailable,
        [
            "NET/IB : No device found.",
            "Failed to initialize NET plugin IB"
        ]
    );
    let r = nccl_log_report(&log, &ib_node());
    assert_eq!(
        r.findings[0].evidence.as_deref(),
        Some("Using network Socket")
    );
    assert!(r.findings[0].reason.contains("NET/IB : No device found."));
    let r = nccl_log_report(&log, &no_hca());
    assert!(r.findings.is_empty());
    assert_eq!(r.network.as_deref(), Some("Socket"));
}

#[test]
fn gpudirect_off_where_the_facts_allow_it_warns() {
    let log = "nccl_info_gdr_disabled_nccl1537.log";
    // dgx1 has GPUs and HCAs on shared PCIe switches but no peer-memory module loaded:
    // GPUDirect was not possible, so its absence is no finding.
    let mut node = ib_node();
    assert_eq!(node.gpudirect.as_ref().unwrap().peer_mem_module, None);
    assert!(codes(log, &node).is_empty());
    node.gpudirect.as_mut().unwrap().peer_mem_module = Some("nvidia_peermem".into());
    assert_eq!(
        codes(log, &node),
        [("gdr-not-used".to_string(), Level::Warn)]
    );
    let r = nccl_log_report(&capture(log), &node);
    assert_eq!(
        r.findings[0].evidence.as_deref(),
        Some("NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'")
    );
}

fn ucx(capture_name: &str, info_d: &str) -> UcxEvidence {
    let (selected, selected_line) = parse_ep_cfg(&capture(capture_name));
    let available = heddle_agent::runner::ucx_parse::parse_info_devices(&capture(info_d))
        .into_iter()
        .map(|t| format!("{}/{}", t.transport, t.device))
        .collect();
    UcxEvidence {
        selected,
        selected_line,
        available,
        mode: Some("loopback".into()),
    }
}

#[test]
fn ucx_over_tcp_fails_only_where_an_ib_port_is_active() {
    let tcp = ucx(
        "ucx_perftest_tag_lat_info_tcp.txt",
        "ucx_info_d_loopback.txt",
    );
    assert_eq!(
        tcp.selected.iter().collect::<Vec<_>>(),
        ["tcp/eth0", "tcp/lo"]
    );
    let f = classify_ucx(Some(&tcp), Some(&ib_node()));
    assert!(
        !f.is_empty()
            && f.iter()
                .all(|f| f.code == "ucx-no-rdma" && f.level == Level::Fail)
    );
    assert!(classify_ucx(Some(&tcp), Some(&no_hca())).is_empty());
    // UCX's own choice between two local processes is shared memory: no network crossed.
    let shm = ucx(
        "ucx_perftest_tag_lat_info_shm.txt",
        "ucx_info_d_seed000_rc.txt",
    );
    assert_eq!(
        shm.selected.iter().collect::<Vec<_>>(),
        ["cma/memory", "sysv/memory"]
    );
    assert!(classify_ucx(Some(&shm), Some(&ib_node())).is_empty());
}

#[test]
fn check_command_exits_by_the_worst_finding() {
    let run = |log: &str, root: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_heddle-agent"))
            .args(["check", "nccl-log"])
            .arg(capture_path(log))
            .arg("--root")
            .arg(fixture(root))
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), json)
    };
    let (code, json) = run("nccl_debug_info_1proc_2gpu_h200.log", "dgx1");
    assert_eq!(code, Some(1));
    assert_eq!(json["network"], "Socket");
    assert_eq!(json["findings"][0]["code"], "socket-fallback");
    assert_eq!(json["findings"][0]["level"], "FAIL");
    let (code, json) = run("nccl_debug_info_1proc_2gpu_h200.log", "ethernet-box");
    assert_eq!(code, Some(0));
    assert_eq!(json["network"], "Socket");
    assert_eq!(json["findings"], serde_json::json!([]));
    let (code, json) = run("nccl_info_ib_gdrdma_nccl707.log", "dgx1");
    assert_eq!(code, Some(0));
    assert_eq!(json["gdr"], true);
    assert_eq!(json["devices"][0]["name"], "mlx5_8");
    assert_eq!(json["transports"]["NET/IB"], 12);
    let out = Command::new(env!("CARGO_BIN_EXE_heddle-agent"))
        .args(["check", "nccl-log", "/nonexistent/log"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/log"));
}
