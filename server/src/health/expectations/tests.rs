//! Tests of `expectations`.

use super::*;
use serde_json::json;

fn fig(test: &str, metric: &str, size: i64, value: f64) -> Figure {
    Figure {
        test: test.into(),
        metric: metric.into(),
        size_bytes: size,
        value,
        pair: None,
    }
}

fn ctx(model: &str, gpus: i32) -> Context {
    Context {
        hostname: "n1".into(),
        gpu_model: Some(model.into()),
        gpus: Some(gpus),
        world_size: 1,
        ..Default::default()
    }
}

#[test]
fn nccl_floor_for_two_h200() {
    let e = builtins(
        &fig("nccl.all_reduce", "busbw_gbs", 8 * GIB, 340.0),
        &ctx("NVIDIA H200", 2),
    );
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].value, 260.0);
    assert!(
        e[0].source.contains("measured by Heddle"),
        "{}",
        e[0].source
    );
    assert!(
        builtins(
            &fig("nccl.all_reduce", "busbw_gbs", 8 * GIB, 1.0),
            &ctx("NVIDIA H200", 4)
        )
        .is_empty(),
        "no row for 4 GPUs"
    );
    assert!(
        builtins(
            &fig("nccl.all_reduce", "busbw_gbs", 8 * GIB, 1.0),
            &ctx("NVIDIA H100 PCIe", 8)
        )
        .is_empty(),
        "PCIe cards excluded"
    );
    assert_eq!(
        builtins(
            &fig("nccl.all_reduce", "busbw_gbs", 8 * GIB, 1.0),
            &ctx("NVIDIA H100 80GB HBM3", 8)
        )[0]
        .value,
        368.0
    );
    let mut multi = ctx("NVIDIA H200", 2);
    multi.world_size = 2;
    assert!(
        builtins(&fig("nccl.all_reduce", "busbw_gbs", 8 * GIB, 1.0), &multi).is_empty(),
        "single node only"
    );
    // Below the reference size the floor does not apply.
    assert!(
        deciding(
            &fig("nccl.all_reduce", "busbw_gbs", 1 << 20, 70.0),
            &ctx("NVIDIA H200", 2),
            &[],
            &[]
        )
        .is_empty()
    );
}

#[test]
fn rdma_floor_from_the_port_perftest_ran_on() {
    let facts = json!({"rdma": {"devices": [
        {"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "rate": "400 Gb/sec (4X NDR)"}]},
        {"name": "mlx5_1", "ports": [{"port": 1, "state": "ACTIVE", "rate": "200 Gb/sec (2X HDR)"},
                                     {"port": 2, "state": "ACTIVE", "rate": "100 Gb/sec (4X EDR)"}]},
        {"name": "mlx5_2", "ports": [{"port": 1, "state": "DOWN", "rate": "10 Gb/sec (4X SDR)"}]}
    ]}});
    let mut c = ctx("", 0);
    c.facts = Some(facts);
    let f = fig("rdma.ib_write_bw", "algbw_gbs", 1 << 20, 45.0);
    // No evidence of the port: no floor, whatever the run's params asked for.
    c.params = json!({"device": "mlx5_0", "ib_port": 1});
    assert!(builtins(&f, &c).is_empty());
    c.perftest_port = Some(("mlx5_1".into(), 2));
    let e = builtins(&f, &c);
    assert_eq!(
        e[0].value, 11.25,
        "mlx5_1 port 2: 100 Gb/s × 0.9 / 8, not mlx5_0's 400"
    );
    assert_eq!(port_rate_rule(&e[0]), Some(Severity::Fail));
    assert!(e[0].source.contains("mlx5_1 port 2"), "{}", e[0].source);
    c.perftest_port = Some(("mlx5_0".into(), 1));
    assert_eq!(builtins(&f, &c)[0].value, 45.0);
    // A port the facts do not list (or list without a rate) gives no floor.
    c.perftest_port = Some(("mlx5_9".into(), 1));
    assert!(builtins(&f, &c).is_empty());
    c.perftest_port = Some(("mlx5_0".into(), 1));
    assert!(builtins(&fig("rdma.ib_write_lat", "time_us", 2, 2.0), &c).is_empty());
    assert_eq!(port_rate_gbits("100 Gb/sec (4X EDR)"), Some(100.0));
    assert_eq!(port_rate_gbits("garbage"), None);
}

#[test]
fn nccl_floor_from_the_ports_nccl_used_across_nodes() {
    let mut c = ctx("H100", 16);
    c.nccl_ports = Some((800.0, "mlx5_0:1 400 Gb/sec, mlx5_1:1 400 Gb/sec".into()));
    let f = fig("nccl.all_reduce", "busbw_gbs", 1 << 30, 50.0);
    assert!(builtins(&f, &c).is_empty(), "one node: no network floor");
    c.world_size = 2;
    let e = builtins(&f, &c);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].value, 800.0 / 8.0 * 0.75);
    assert_eq!(port_rate_rule(&e[0]), Some(Severity::Warn));
    assert!(e[0].source.contains("mlx5_1:1"), "{}", e[0].source);
    c.nccl_ports = None;
    assert!(
        builtins(&f, &c).is_empty(),
        "no evidence of the ports: no floor"
    );
}

#[test]
fn pcie_floor_from_the_gpu_model() {
    assert!((pcie_gbs(5, 16).unwrap() - 63.015).abs() < 0.01);
    assert!((pcie_gbs(3, 16).unwrap() - 15.754).abs() < 0.01);
    let e = builtins(
        &fig("p2p.h2d", "algbw_gbs", 1 << 28, 50.0),
        &ctx("NVIDIA H200", 2),
    );
    assert_eq!(e[0].value, 44.1);
    assert_eq!(
        builtins(
            &fig("p2p.d2h", "algbw_gbs", 1 << 28, 50.0),
            &ctx("Tesla V100-SXM2-32GB", 8)
        )[0]
        .value,
        11.0
    );
    assert!(
        builtins(
            &fig("p2p.d2d", "algbw_gbs", 1 << 28, 50.0),
            &ctx("NVIDIA H200", 2)
        )
        .is_empty()
    );
}

#[test]
fn operators_override_plugins_which_override_builtins() {
    let f = fig("nccl.all_reduce", "busbw_gbs", 8 * GIB, 300.0);
    let c = ctx("NVIDIA H200", 2);
    let mut op = builtin(
        "acceptance test".into(),
        "nccl.all_reduce",
        "busbw_gbs",
        GIB,
        330.0,
    );
    op.origin = "operator".into();
    let mut pl = builtin(
        "plugin x: sku".into(),
        "nccl.all_reduce",
        "busbw_gbs",
        0,
        310.0,
    );
    pl.origin = "plugin".into();
    assert_eq!(
        deciding(&f, &c, &[op.clone()], &[pl.clone()])[0].value,
        330.0
    );
    assert_eq!(deciding(&f, &c, &[], &[pl.clone()])[0].value, 310.0);
    assert_eq!(deciding(&f, &c, &[], &[])[0].origin, "builtin");
    // Scoped to another node or GPU model: does not apply, the next origin decides.
    op.node = Some("other".into());
    assert_eq!(deciding(&f, &c, &[op.clone()], &[])[0].origin, "builtin");
    op.node = Some("n1".into());
    op.gpu_model = Some("h200".into());
    assert!(applies(&op, &f, &c), "GPU model matches case-insensitively");
    op.min_size_bytes = 16 * GIB;
    assert!(
        !applies(&op, &f, &c),
        "measured below the expectation's size"
    );
}

#[test]
fn the_builtin_table_lists_every_row_with_a_source() {
    let t = builtin_table();
    assert!(
        t.iter()
            .all(|e| !e.source.is_empty() && e.origin == "builtin")
    );
    assert!(t.iter().any(|e| e.test == "rdma.ib_write_bw"));
}
