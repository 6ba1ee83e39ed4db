use serde_json::json;

use super::*;

/// A two-node all_reduce over 16 GPUs on a RoCE cluster: the large-size figures are seed
/// 003's (busbw 122.3 GB/s with RDMA, 29.1 GB/s with NCCL_IB_DISABLE=1), the smaller
/// sizes follow the usual nccl-tests curve. Out-of-place and in-place rows per size.
const TABLE: &[(i64, f64, f64)] = &[
    (8, 0.0, 0.0),
    (1 << 10, 0.05, 0.03),
    (64 << 10, 2.9, 1.1),
    (1 << 20, 25.4, 6.8),
    (16 << 20, 88.0, 21.7),
    (64 << 20, 116.5, 27.9),
    (128 << 20, 122.3, 29.1),
];

fn row(leg: Leg, size: i64, busbw: f64, in_place: bool) -> ResultRow {
    ResultRow {
        size_bytes: size,
        op: Some("all_reduce".into()),
        in_place: Some(in_place),
        busbw_gbs: Some(busbw),
        labels: [(LEG_LABEL.to_string(), leg.as_str().to_string())].into(),
        ..Default::default()
    }
}

fn rows() -> Vec<ResultRow> {
    let mut out = Vec::new();
    for leg in Leg::ALL {
        for &(size, rdma, socket) in TABLE {
            let bw = if leg == Leg::Rdma { rdma } else { socket };
            // in-place a little slower, as nccl-tests shows it
            out.push(row(leg, size, bw * 1.01, false));
            out.push(row(leg, size, bw * 0.99, true));
        }
    }
    out
}

fn facts(devices: serde_json::Value) -> NodeFacts {
    serde_json::from_value(json!({
        "schema_version": 1, "collected_at": "2026-11-24T00:00:00Z", "live": false,
        "host": {"hostname": "n1", "os": {}, "dmi": {}, "container": {"kubernetes": false}},
        "cpu": {}, "nvml": {"state": "not_consulted", "message": "fixture"},
        "rdma": {"sysfs": {"state": "available", "message": ""},
                 "verbs": {"state": "not_consulted", "message": ""}, "devices": devices},
        "network": {}, "software": {}, "topology": {"nvlink_source": "fixture"}
    }))
    .expect("facts decode")
}

fn roce_node() -> NodeFacts {
    facts(
        json!([{"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE",
        "link_layer": "Ethernet", "rate": "100 Gb/sec (4X EDR)",
        "gids": [{"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001", "gid_type": "RoCE v2"}]}]}]),
    )
}

fn bare_node() -> NodeFacts {
    facts(json!([]))
}

fn ib_leg() -> serde_json::Value {
    json!({"nccl_evidence": {
        "network": "IB", "network_line": "Using network IB",
        "devices": [{"name": "mlx5_0", "port": 1, "link_layer": "RoCE"}],
        "transports": {"NET/IB": 16, "P2P": 32}, "channel_transports": ["NET/IB/0/GDRDMA"],
        "gdr": true, "channel_lines": 48
    }})
}

fn socket_leg() -> serde_json::Value {
    json!({"nccl_evidence": {
        "network": "Socket", "network_line": "Using network Socket",
        "transports": {"NET/Socket": 16, "P2P": 32}, "channel_transports": ["NET/Socket/0"],
        "env": {"NCCL_IB_DISABLE": "1"}, "channel_lines": 48
    }})
}

fn summary(
    rdma: serde_json::Value,
    socket: serde_json::Value,
    rows: &[ResultRow],
) -> serde_json::Value {
    json!({"kind": KIND, "legs": {"rdma": rdma, "socket": socket},
           "comparison": AbComparison::from_rows(rows)})
}

fn codes(f: &[Finding]) -> Vec<(&str, Level)> {
    f.iter().map(|f| (f.code.as_str(), f.level)).collect()
}

#[test]
fn legs_pair_by_size_and_bands_take_the_mean() {
    let c = AbComparison::from_rows(&rows());
    assert_eq!(c.points.len(), TABLE.len());
    let last = c.points.last().unwrap();
    assert_eq!(last.size_bytes, 128 << 20);
    assert!((last.rdma_busbw_gbs - 122.3).abs() < 1e-9, "{last:?}");
    assert!((last.socket_busbw_gbs - 29.1).abs() < 1e-9);
    assert_eq!(c.points[0].ratio, None, "a socket figure of 0 has no ratio");
    let names: Vec<Band> = c.bands.iter().map(|b| b.band).collect();
    assert_eq!(names, Band::ALL);
    let large = c.band(Band::Large).unwrap();
    assert_eq!((large.sizes, large.max_size_bytes), (2, 128 << 20));
    let expect = (116.5 + 122.3) / (27.9 + 29.1);
    assert!((large.ratio.unwrap() - expect).abs() < 1e-9);
    let (size, speedup) = c.speedup().unwrap();
    assert_eq!(size, 128 << 20);
    assert!(
        speedup > MIN_SPEEDUP * 2.0,
        "seed 003's RDMA is clearly faster: {speedup}"
    );
    // 64 KiB is the first medium size; 1 KiB and 8 B are small
    assert_eq!(c.band(Band::Small).unwrap().sizes, 2);
    assert_eq!(c.band(Band::Medium).unwrap().sizes, 3);
}

#[test]
fn rows_without_both_legs_or_a_label_are_left_out() {
    let mut r = rows();
    r.push(ResultRow {
        size_bytes: 256 << 20,
        busbw_gbs: Some(130.0),
        ..Default::default()
    });
    r.push(row(Leg::Rdma, 512 << 20, 131.0, false));
    let c = AbComparison::from_rows(&r);
    assert_eq!(c.points.last().unwrap().size_bytes, 128 << 20);
    let small_only: Vec<ResultRow> = rows()
        .into_iter()
        .filter(|r| r.size_bytes < 1 << 20)
        .collect();
    assert_eq!(AbComparison::from_rows(&small_only).speedup(), None);
    assert_eq!(AbComparison::from_rows(&[]), AbComparison::default());
}

#[test]
fn the_socket_leg_is_forced_and_one_node_crosses_the_network() {
    assert_eq!(Leg::Rdma.env(2), Vec::<(&str, &str)>::new());
    assert_eq!(
        Leg::Socket.env(2),
        [("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "Socket")]
    );
    let one = Leg::Rdma.env(1);
    assert!(one.contains(&("NCCL_P2P_DISABLE", "1")) && one.contains(&("NCCL_SHM_DISABLE", "1")));
    for (name, value) in Leg::Socket.env(1) {
        crate::env_policy::check_name(name).unwrap();
        crate::env_policy::check_value(name, value).unwrap();
    }
}

#[test]
fn a_healthy_comparison_on_a_roce_node_has_no_finding() {
    let s = summary(ib_leg(), socket_leg(), &rows());
    assert_eq!(codes(&classify(&s, Some(&roce_node()))), []);
    assert!(rdma_expected(&roce_node()));
    assert!(!rdma_expected(&bare_node()));
}

#[test]
fn a_node_without_an_active_port_says_so() {
    let s = summary(socket_leg(), socket_leg(), &rows());
    let f = classify(&s, Some(&bare_node()));
    assert_eq!(codes(&f), [(RDMA_AB_INCONCLUSIVE, Level::Warn)]);
    assert!(
        f[0].reason.contains("no ACTIVE InfiniBand or RoCE port"),
        "{}",
        f[0].reason
    );
    let f = classify(&s, None);
    assert!(f[0].reason.contains("facts are unknown"), "{f:?}");
}

#[test]
fn an_rdma_leg_on_sockets_fails_as_a_fallback() {
    let s = summary(socket_leg(), socket_leg(), &rows());
    let f = classify(&s, Some(&roce_node()));
    assert_eq!(codes(&f), [(transport::SOCKET_FALLBACK, Level::Fail)]);
    assert!(
        f[0].reason.starts_with("RDMA leg: NCCL used TCP sockets"),
        "{}",
        f[0].reason
    );
}

#[test]
fn a_socket_leg_on_rdma_or_a_short_sweep_is_inconclusive() {
    let s = summary(ib_leg(), ib_leg(), &rows());
    let f = classify(&s, Some(&roce_node()));
    assert_eq!(codes(&f), [(RDMA_AB_INCONCLUSIVE, Level::Warn)]);
    assert_eq!(f[0].evidence.as_deref(), Some("Using network IB"));
    let short: Vec<ResultRow> = rows()
        .into_iter()
        .filter(|r| r.size_bytes <= 16 << 20)
        .collect();
    let f = classify(&summary(ib_leg(), socket_leg(), &short), Some(&roce_node()));
    assert_eq!(codes(&f), [(RDMA_AB_INCONCLUSIVE, Level::Warn)]);
    assert!(f[0].reason.contains("64 MiB"));
    let local =
        json!({"nccl_evidence": {"network": "IB", "transports": {"P2P": 8}, "channel_lines": 8}});
    let f = classify(&summary(local, socket_leg(), &rows()), Some(&roce_node()));
    assert!(
        f.iter().any(|f| f.reason.contains("crossed no network")),
        "{f:?}"
    );
    let f = classify(&json!({"legs": {"rdma": ib_leg()}}), Some(&roce_node()));
    assert!(
        f.iter()
            .any(|f| f.reason.contains("socket leg recorded no")),
        "{f:?}"
    );
}

#[test]
fn a_missing_rdma_log_is_transport_unknown() {
    let s = summary(json!({}), socket_leg(), &rows());
    let f = classify(&s, Some(&roce_node()));
    assert_eq!(codes(&f), [(transport::TRANSPORT_UNKNOWN, Level::Warn)]);
}

#[test]
fn the_path_line_names_both_legs() {
    let s = summary(ib_leg(), socket_leg(), &rows());
    let line = crate::kinds::path_line(KIND, &s).unwrap();
    assert!(
        line.starts_with("rdma leg: network IB over mlx5_0:1/RoCE"),
        "{line}"
    );
    assert!(line.contains(" | socket leg: network Socket"), "{line}");
    assert_eq!(crate::kinds::path_line(KIND, &json!({})), None);
}
