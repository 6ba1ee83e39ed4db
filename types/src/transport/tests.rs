use serde_json::json;

use super::*;

/// Facts of a node with the given RDMA devices, topology and GPUDirect section.
fn facts(
    devices: serde_json::Value,
    topology: serde_json::Value,
    gpudirect: serde_json::Value,
) -> NodeFacts {
    serde_json::from_value(json!({
        "schema_version": 1,
        "collected_at": "2026-11-24T00:00:00Z",
        "live": false,
        "host": {"hostname": "n1", "os": {}, "dmi": {}, "container": {"kubernetes": false}},
        "cpu": {},
        "nvml": {"state": "not_consulted", "message": "fixture"},
        "rdma": {
            "sysfs": {"state": "available", "message": ""},
            "verbs": {"state": "not_consulted", "message": ""},
            "devices": devices
        },
        "network": {},
        "software": {},
        "topology": topology,
        "gpudirect": gpudirect
    }))
    .expect("facts decode")
}

fn ib_node() -> NodeFacts {
    facts(
        json!([{"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)"}]}]),
        json!({"devices": ["GPU0", "mlx5_0"], "matrix": [["X", "PIX"], ["PIX", "X"]], "nvlink_source": "fixture"}),
        json!({"peer_mem_module": "nvidia_peermem", "gdrdrv": false}),
    )
}

fn bare_node() -> NodeFacts {
    facts(json!([]), json!({"nvlink_source": "fixture"}), json!(null))
}

fn socket_evidence() -> NcclEvidence {
    NcclEvidence {
        network: Some("Socket".into()),
        network_line: Some("Using network Socket".into()),
        ib_unavailable: vec!["NET/IB : No device found.".into()],
        ..Default::default()
    }
}

#[test]
fn socket_with_an_active_port_fails_and_quotes_nccl() {
    let f = classify_nccl(Some(&socket_evidence()), Some(&ib_node()));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].code.as_str(), f[0].level),
        (SOCKET_FALLBACK, Level::Fail)
    );
    assert_eq!(f[0].evidence.as_deref(), Some("Using network Socket"));
    assert!(
        f[0].reason.contains("NET/IB : No device found."),
        "{}",
        f[0].reason
    );
    assert!(
        f[0].reason
            .contains("mlx5_0 port 1 (InfiniBand, 400 Gb/sec (4X NDR))"),
        "{}",
        f[0].reason
    );
    // Without an HCA sockets are the only path: nothing to say.
    assert!(classify_nccl(Some(&socket_evidence()), Some(&bare_node())).is_empty());
    // A DOWN port does not count.
    let down = facts(
        json!([{"name": "mlx5_0", "ports": [{"port": 1, "state": "DOWN", "link_layer": "InfiniBand"}]}]),
        json!({"nvlink_source": "fixture"}),
        json!(null),
    );
    assert!(classify_nccl(Some(&socket_evidence()), Some(&down)).is_empty());
}

#[test]
fn ib_disable_is_named_as_the_fix() {
    let mut ev = socket_evidence();
    ev.env.insert("NCCL_IB_DISABLE".into(), "1".into());
    let f = classify_nccl(Some(&ev), Some(&ib_node()));
    assert!(
        f[0].reason.contains("NCCL_IB_DISABLE=1 is set"),
        "{}",
        f[0].reason
    );
}

#[test]
fn silence_is_never_a_pass() {
    for ev in [None, Some(NcclEvidence::default())] {
        let f = classify_nccl(ev.as_ref(), Some(&ib_node()));
        assert_eq!(
            (f[0].code.as_str(), f[0].level),
            (TRANSPORT_UNKNOWN, Level::Warn)
        );
    }
    let f = classify_ucx(None, None);
    assert_eq!(f[0].code, TRANSPORT_UNKNOWN);
}

#[test]
fn gdr_not_used_needs_the_facts_to_allow_it() {
    let mut ev = NcclEvidence {
        network: Some("IB".into()),
        gdr: Some(false),
        gdr_line: Some("Channel 00 : 0[0] -> 1[0] [send] via NET/IB/0".into()),
        ..Default::default()
    };
    ev.transports.insert("NET/IB".into(), 4);
    let f = classify_nccl(Some(&ev), Some(&ib_node()));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].code.as_str(), f[0].level),
        (GDR_NOT_USED, Level::Warn)
    );
    assert!(f[0].reason.contains("nvidia_peermem"), "{}", f[0].reason);
    // No peer-memory module: GPUDirect was not possible, so its absence is no finding.
    let mut no_module = ib_node();
    no_module.gpudirect.as_mut().unwrap().peer_mem_module = None;
    assert!(classify_nccl(Some(&ev), Some(&no_module)).is_empty());
    // GPU and HCA on different sockets (SYS): not possible either.
    let mut far = ib_node();
    far.topology.matrix = vec![
        vec!["X".into(), "SYS".into()],
        vec!["SYS".into(), "X".into()],
    ];
    assert!(classify_nccl(Some(&ev), Some(&far)).is_empty());
    ev.gdr = Some(true);
    assert!(classify_nccl(Some(&ev), Some(&ib_node())).is_empty());
}

#[test]
fn ucx_without_verbs_on_an_ib_node_fails() {
    let tcp = UcxEvidence {
        selected: ["tcp/lo".to_string()].into(),
        selected_line: Some("ep_cfg[0]: tag(tcp/lo)".into()),
        available: ["tcp/lo".to_string(), "sysv/memory".to_string()].into(),
        mode: Some("loopback".into()),
    };
    let f = classify_ucx(Some(&tcp), Some(&ib_node()));
    assert_eq!(f.len(), 2, "{f:?}");
    assert!(
        f.iter()
            .all(|f| f.code == UCX_NO_RDMA && f.level == Level::Fail)
    );
    assert!(classify_ucx(Some(&tcp), Some(&bare_node())).is_empty());
    let rc = UcxEvidence {
        selected: ["rc_mlx5/mlx5_0:1".to_string()].into(),
        available: ["rc_mlx5/mlx5_0:1".to_string(), "tcp/ib0".to_string()].into(),
        ..tcp.clone()
    };
    assert!(classify_ucx(Some(&rc), Some(&ib_node())).is_empty());
    // Shared memory between two local processes crossed no network.
    let shm = UcxEvidence {
        selected: ["sysv/memory".to_string(), "cma/memory".to_string()].into(),
        available: ["rc_verbs/mlx5_0:1".to_string()].into(),
        ..tcp
    };
    assert!(classify_ucx(Some(&shm), Some(&ib_node())).is_empty());
    assert!(is_verbs_transport("dc_mlx5") && is_verbs_transport("ud_verbs/mlx5_0:1"));
    assert!(!is_verbs_transport("tcp") && !is_verbs_transport("rdmacm"));
}

#[test]
fn port_rates() {
    assert_eq!(port_rate_gbits("400 Gb/sec (4X NDR)"), Some(400.0));
    assert_eq!(port_rate_gbits("banana"), None);
    assert_eq!(active_ports(&ib_node())[0].gbits, Some(400.0));
}

#[test]
fn ports_nccl_used_come_from_the_channel_indexes() {
    let ev = NcclEvidence {
        devices: vec![
            NetDevice {
                name: "mlx5_9".into(),
                port: Some(1),
                link_layer: Some("IB".into()),
            },
            NetDevice {
                name: "mlx5_0".into(),
                port: Some(1),
                link_layer: Some("IB".into()),
            },
        ],
        channel_transports: ["NET/IB/1/GDRDMA".to_string(), "P2P/IPC".to_string()].into(),
        ..Default::default()
    };
    let (gbits, names) = nccl_used_ports(&ev, &ib_node()).unwrap();
    assert_eq!(gbits, 400.0);
    assert!(names.starts_with("mlx5_0:1"), "{names}");
    // An index whose device the facts do not know: no floor rather than a wrong one.
    let other = NcclEvidence {
        channel_transports: ["NET/IB/0".to_string()].into(),
        ..ev
    };
    assert_eq!(nccl_used_ports(&other, &ib_node()), None);
}
