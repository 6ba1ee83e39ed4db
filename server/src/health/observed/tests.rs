use heddle_types::observe::NetUse;
use heddle_types::observed::BandFigure;

use super::*;

fn comm(nnodes: u32, net: &[(&str, u64)], busbw_time_ns: u64) -> ObservedComm {
    let net: Vec<NetUse> = net
        .iter()
        .map(|(n, b)| NetUse {
            net: (*n).into(),
            ops: 1,
            bytes: *b,
            inferred: false,
        })
        .collect();
    ObservedComm {
        comm_hash: "c1".into(),
        name: None,
        nranks: 16,
        nnodes,
        local_ranks: 8,
        transport: heddle_types::observed::dominant_net(&net).map(str::to_string),
        net,
        bands: vec![BandFigure {
            func: "AllReduce".into(),
            size_band: 30,
            ops: 1,
            bytes: 1 << 30,
            time_ns: busbw_time_ns,
            gpu_timed_ops: 1,
            note: None,
            algbw_gbs: heddle_types::observed::bandwidths("AllReduce", 16, 1 << 30, busbw_time_ns)
                .map(|b| b.0),
            busbw_gbs: heddle_types::observed::bandwidths("AllReduce", 16, 1 << 30, busbw_time_ns)
                .map(|b| b.1),
        }],
        finalized: false,
        seq: 1,
        written_at: Utc::now(),
    }
}

fn ib_node() -> NodeContext {
    NodeContext {
        active_rdma_ports: vec!["mlx5_0/1 (InfiniBand)".into()],
        has_recommendations: false,
        baselines: HashMap::new(),
    }
}

#[test]
fn sockets_on_an_ib_node_fail() {
    let (v, r) = decide(
        &[comm(2, &[("Socket", 1 << 30)], 1)],
        false,
        &ib_node(),
        0.25,
    );
    assert_eq!(v, Verdict::Fail);
    assert_eq!(r[0].code.as_deref(), Some("job-socket-fallback"));
    assert!(r[0].message.contains("mlx5_0/1"), "{}", r[0].message);
    // Over IB: pass.
    let (v, r) = decide(&[comm(2, &[("IB", 1 << 30)], 1)], false, &ib_node(), 0.25);
    assert_eq!((v, r.len()), (Verdict::Pass, 0));
    // One node: sockets say nothing about the network.
    let (v, _) = decide(
        &[comm(1, &[("Socket", 1 << 30)], 1)],
        false,
        &ib_node(),
        0.25,
    );
    assert_eq!(v, Verdict::Unknown);
    // No ACTIVE RDMA port: sockets are all there is.
    let (v, _) = decide(
        &[comm(2, &[("Socket", 1 << 30)], 1)],
        false,
        &NodeContext::default(),
        0.25,
    );
    assert_eq!(v, Verdict::Unknown);
}

#[test]
fn large_message_busbw_below_the_node_test_warns() {
    let mut node = ib_node();
    node.baselines.insert(("nccl.all_reduce".into(), 2), 100.0);
    // 1 GiB in 10 ms on 16 ranks: algbw 107.4, busbw 201 GB/s: above.
    let (v, _) = decide(&[comm(2, &[("IB", 1)], 10_000_000)], false, &node, 0.25);
    assert_eq!(v, Verdict::Pass);
    // In 40 ms: busbw 50 GB/s, 50 % below 100.
    let (v, r) = decide(&[comm(2, &[("IB", 1)], 40_000_000)], false, &node, 0.25);
    assert_eq!(v, Verdict::Warn);
    assert_eq!(r[0].code.as_deref(), Some("job-below-expected"));
    assert_eq!(r[0].expected, Some(100.0));
    assert!((r[0].observed.unwrap() - 50.3).abs() < 0.1);
    // Within a looser fraction: fine.
    let (v, _) = decide(&[comm(2, &[("IB", 1)], 40_000_000)], false, &node, 0.6);
    assert_eq!(v, Verdict::Pass);
    // A baseline of another node count is not compared.
    let (v, _) = decide(&[comm(4, &[], 40_000_000)], false, &node, 0.25);
    assert_eq!(v, Verdict::Unknown);
}

#[test]
fn an_unknown_verdict_says_why() {
    // Two nodes over sockets, no RDMA port, no test to compare with: 128 MiB all-reduces
    // at 1.5 GB/s (1 GiB in 716 ms on 16 ranks: busbw 2.8 GB/s).
    let (v, r) = decide(
        &[comm(2, &[("Socket", 1 << 30)], 716_000_000)],
        false,
        &NodeContext::default(),
        0.25,
    );
    assert_eq!(v, Verdict::Unknown);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].code.as_deref(), Some("job-unjudged"));
    assert_eq!(r[0].severity, Severity::Info);
    let m = &r[0].message;
    for part in [
        "c1 (16 ranks on 2 nodes over Socket)",
        "no ACTIVE RDMA port",
        "no passing nccl.all_reduce test on 2 nodes",
        "2.8 GB/s bus bandwidth at 1 GiB",
        "no recommendations",
    ] {
        assert!(m.contains(part), "{part:?} not in {m}");
    }
    // A band above its path's limit is neither judged nor quoted.
    let mut node = NodeContext::default();
    node.baselines.insert(("nccl.all_reduce".into(), 2), 100.0);
    let (v, r) = decide(&[comm(2, &[("IB", 1)], 1)], false, &node, 0.25);
    assert_eq!(v, Verdict::Unknown, "{r:?}");
    assert!(
        r[0].message.contains("no GPU-timed collective of 64 MiB"),
        "{r:?}"
    );
    // Judged: no job-unjudged reason.
    let (v, r) = decide(&[comm(2, &[("IB", 1)], 10_000_000)], false, &node, 0.25);
    assert_eq!((v, r.len()), (Verdict::Pass, 0), "{r:?}");
    let (v, r) = decide(
        &[comm(2, &[("IB", 1)], 10_000_000)],
        false,
        &ib_node(),
        0.25,
    );
    assert_eq!((v, r.len()), (Verdict::Pass, 0), "{r:?}");
    let (_, r) = decide(&[], false, &NodeContext::default(), 0.25);
    assert!(
        r[0].message.contains("no communicator reported yet"),
        "{r:?}"
    );
}

#[test]
fn env_missing_warns_only_where_there_are_recommendations() {
    let mut node = NodeContext::default();
    assert_eq!(decide(&[], true, &node, 0.25).0, Verdict::Unknown);
    node.has_recommendations = true;
    let (v, r) = decide(&[], true, &node, 0.25);
    assert_eq!(v, Verdict::Warn);
    assert_eq!(r[0].code.as_deref(), Some("job-env-missing"));
    assert_eq!(decide(&[], false, &node, 0.25).0, Verdict::Pass);
}
