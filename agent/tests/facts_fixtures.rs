//! Fact collection against fixture trees that reproduce real machines (see
//! `tests/fixtures/README.md`), snapshot-tested, plus targeted checks against the
//! captured tool output in the runbooks the fixtures come from.

use std::collections::BTreeMap;

use heddle_agent::facts::{CollectOptions, collect, facts_sha256, render_topology};
use heddle_testkit::files::agent_fixture as fixture;
use heddle_types::facts::{NodeFacts, ProbeState};

fn facts(name: &str) -> NodeFacts {
    collect(&CollectOptions::for_root(fixture(name)))
}

fn snapshot(name: &str) -> NodeFacts {
    let f = facts(name);
    insta::assert_json_snapshot!(name, f, { ".collected_at" => "[collected_at]" });
    f
}

/// Parses a `nvidia-smi topo -m` capture into (row, column) → label.
fn parse_topo(text: &str) -> BTreeMap<(String, String), String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let mut out = BTreeMap::new();
    for line in lines {
        let cells: Vec<&str> = line.split_whitespace().collect();
        for (col, label) in header.iter().zip(&cells[1..]) {
            if col.starts_with("GPU") || col.starts_with("mlx5") {
                out.insert((cells[0].to_string(), col.to_string()), label.to_string());
            }
        }
    }
    out
}

/// Every PCIe relation of the capture must come out the same. GPU pairs joined by NVLink
/// are skipped: NVML is not consulted on fixtures, so those show their PCIe path instead.
fn assert_topology_matches(f: &NodeFacts, capture: &str) {
    let expected = parse_topo(capture);
    let idx = |name: &str| {
        f.topology
            .devices
            .iter()
            .position(|d| d == name)
            .unwrap_or_else(|| panic!("{name} missing from {:?}", f.topology.devices))
    };
    let mut compared = 0;
    for ((row, col), label) in &expected {
        if label.starts_with("NV") {
            continue;
        }
        let got = &f.topology.matrix[idx(row)][idx(col)];
        assert_eq!(
            got,
            label,
            "{row} x {col}\n{}",
            render_topology(&f.topology)
        );
        compared += 1;
    }
    assert!(compared > 20, "only {compared} cells compared");
}

/// Seed 004, `nvidia-smi topo -m` on the DGX-1.
const DGX1_TOPO: &str = "
	GPU0	GPU1	GPU2	GPU3	GPU4	GPU5	GPU6	GPU7	mlx5_0	mlx5_2	mlx5_1	mlx5_3	CPU Affinity
GPU0	 X 	NV1	NV1	NV2	NV2	SYS	SYS	SYS	PIX	SYS	PHB	SYS	0-19,40-59
GPU1	NV1	 X 	NV2	NV1	SYS	NV2	SYS	SYS	PIX	SYS	PHB	SYS	0-19,40-59
GPU2	NV1	NV2	 X 	NV2	SYS	SYS	NV1	SYS	PHB	SYS	PIX	SYS	0-19,40-59
GPU3	NV2	NV1	NV2	 X 	SYS	SYS	SYS	NV1	PHB	SYS	PIX	SYS	0-19,40-59
GPU4	NV2	SYS	SYS	SYS	 X 	NV1	NV1	NV2	SYS	PIX	SYS	PHB	20-39,60-79
GPU5	SYS	NV2	SYS	SYS	NV1	 X 	NV2	NV1	SYS	PIX	SYS	PHB	20-39,60-79
GPU6	SYS	SYS	NV1	SYS	NV1	NV2	 X 	NV2	SYS	PHB	SYS	PIX	20-39,60-79
GPU7	SYS	SYS	SYS	NV1	NV2	NV1	NV2	 X 	SYS	PHB	SYS	PIX	20-39,60-79
mlx5_0	PIX	PIX	PHB	PHB	SYS	SYS	SYS	SYS	 X 	SYS	PHB	SYS
mlx5_2	SYS	SYS	SYS	SYS	PIX	PIX	PHB	PHB	SYS	 X 	SYS	PHB
mlx5_1	PHB	PHB	PIX	PIX	SYS	SYS	SYS	SYS	PHB	SYS	 X 	SYS
mlx5_3	SYS	SYS	SYS	SYS	PHB	PHB	PIX	PIX	SYS	PHB	SYS	 X
";

/// Seed 001, `nvidia-smi topo -m` on the Azure ND40rs_v2.
const AZURE_TOPO: &str = "
        GPU0  GPU1  GPU2  GPU3  GPU4  GPU5  GPU6  GPU7  mlx5_0  CPU Affinity  NUMA Affinity
GPU0    X     NV2   NV1   NV2   NODE  NODE  NV1   NODE  NODE    0-19          0
GPU1    NV2   X     NV2   NV1   NODE  NODE  NODE  NV1   NODE    0-19          0
GPU2    NV1   NV2   X     NV1   NV2   NODE  NODE  NODE  NODE    0-19          0
GPU3    NV2   NV1   NV1   X     NODE  NV2   NODE  NODE  NODE    0-19          0
GPU4    NODE  NODE  NV2   NODE  X     NV1   NV1   NV2   NODE    0-19          0
GPU5    NODE  NODE  NODE  NV2   NV1   X     NV2   NV1   NODE    0-19          0
GPU6    NV1   NODE  NODE  NODE  NV1   NV2   X     NV2   NODE    0-19          0
GPU7    NODE  NV1   NODE  NODE  NV2   NV1   NV2   X     NODE    0-19          0
mlx5_0  NODE  NODE  NODE  NODE  NODE  NODE  NODE  NODE  X
";

#[test]
fn dgx1_matches_the_captured_topology() {
    let f = snapshot("dgx1");
    assert_topology_matches(&f, DGX1_TOPO);
    let affinity: Vec<_> = f
        .topology
        .gpu_affinity
        .iter()
        .map(|a| (a.cpu_affinity.as_deref().unwrap(), a.numa_node.unwrap()))
        .collect();
    assert_eq!(affinity[..4], [("0-19,40-59", 0); 4]);
    assert_eq!(affinity[4..], [("20-39,60-79", 1); 4]);
    assert_eq!(f.gpus.len(), 8);
    assert!(
        f.gpus
            .iter()
            .all(|g| g.name.as_deref() == Some("Tesla V100-SXM2-16GB"))
    );
    let hcas: Vec<_> = f
        .rdma
        .devices
        .iter()
        .map(|d| {
            (
                d.name.as_str(),
                d.netdevs.join(","),
                d.ports[0].lid.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hcas,
        [
            ("mlx5_0", "ib0".into(), "0xf"),
            ("mlx5_1", "ib1".into(), "0x6"),
            ("mlx5_2", "ib2".into(), "0x2"),
            ("mlx5_3", "ib3".into(), "0x11")
        ]
    );
    assert!(f.errors.is_empty(), "{:?}", f.errors);
}

#[test]
fn azure_nd40rs_v2_separates_ib_from_accelerated_networking() {
    let f = snapshot("azure-nd40rs-v2");
    assert_topology_matches(&f, AZURE_TOPO);
    assert_eq!(f.host.azure_enable_rdma, Some(true));
    assert_eq!(
        f.host.dmi.sys_vendor.as_deref(),
        Some("Microsoft Corporation")
    );
    let layers: Vec<_> = f
        .rdma
        .devices
        .iter()
        .map(|d| {
            (
                d.name.as_str(),
                d.ports[0].state.as_str(),
                d.ports[0].link_layer.as_deref().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        layers,
        [
            ("mlx5_0", "ACTIVE", "InfiniBand"),
            ("rdmaP36305p0s2", "ACTIVE", "Ethernet")
        ]
    );
    let ib = f
        .network
        .interfaces
        .iter()
        .find(|i| i.name == "ibP59423s2")
        .unwrap();
    assert_eq!(
        (ib.kind.as_str(), ib.mtu, ib.pci_bdf.as_deref()),
        ("infiniband", Some(4092), Some("e81f:00:02.0"))
    );
    let vf = f
        .network
        .interfaces
        .iter()
        .find(|i| i.name == "enP44906s1")
        .unwrap();
    assert_eq!(vf.master.as_deref(), Some("eth0"));
    assert_eq!(
        f.gpus.iter().map(|g| g.bdf.as_str()).collect::<Vec<_>>()[..2],
        ["0001:00:00.0", "0002:00:00.0"]
    );
    assert!(f.errors.is_empty(), "{:?}", f.errors);
}

#[test]
fn runai_pod_finds_the_ipv4_roce_v2_gid_like_the_runbook() {
    let f = snapshot("runai-roce-pod");
    let dev = &f.rdma.devices[0];
    assert_eq!(dev.name, "mlx5_bond_0");
    let port = &dev.ports[0];
    assert_eq!(port.link_layer.as_deref(), Some("Ethernet"));
    // The runbook's grep: IPv4-mapped GIDs whose type is RoCE v2 → index 9.
    let v2_ipv4: Vec<u32> = port
        .gids
        .iter()
        .filter(|g| g.ipv4.is_some() && g.gid_type.as_deref() == Some("RoCE v2"))
        .map(|g| g.index)
        .collect();
    assert_eq!(v2_ipv4, [9]);
    assert_eq!(
        port.gids
            .iter()
            .filter(|g| g.gid_type.as_deref() == Some("IB/RoCE v1"))
            .count(),
        5
    );
    assert_eq!(dev.netdevs, ["bond0", "net1"]);
    let ctx = &f.host.container;
    assert!(ctx.kubernetes);
    assert_eq!(
        ctx.launcher_env.get("WORLD_SIZE").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        ctx.launcher_env.get("MASTER_ADDR").map(String::as_str),
        Some("my-first-distributed-app-master-0")
    );
    assert!(!ctx.launcher_env.contains_key("RUNAI_API_TOKEN"));
    assert!(!ctx.launcher_env.contains_key("PATH"));
    // GPU0 shares the lower switch with the NIC; GPU1 sits behind a sibling switch.
    assert_eq!(f.topology.matrix[0][2], "PIX");
    assert_eq!(f.topology.matrix[1][2], "PXB");
    assert_eq!(f.topology.matrix[0][1], "PXB");
    assert!(f.errors.is_empty(), "{:?}", f.errors);
}

#[test]
fn ethernet_box_says_there_is_no_rdma() {
    let f = snapshot("ethernet-box");
    assert!(f.gpus.is_empty());
    assert_eq!(f.rdma.sysfs.state, ProbeState::Missing);
    assert!(
        f.rdma.sysfs.message.starts_with("no RDMA devices"),
        "{}",
        f.rdma.sysfs.message
    );
    assert_eq!(f.nvml.state, ProbeState::NotConsulted);
    let bond = f
        .network
        .interfaces
        .iter()
        .find(|i| i.name == "bond0")
        .unwrap();
    assert_eq!(bond.slaves, ["eno1", "eno2"]);
    assert!(bond.virtual_device);
    assert_eq!(f.host.container.runtime.as_deref(), Some("docker"));
    assert!(f.errors.is_empty(), "{:?}", f.errors);
}

#[test]
fn garbage_becomes_per_field_errors() {
    let f = snapshot("garbage");
    let fields: Vec<&str> = f.errors.iter().map(|e| e.field.as_str()).collect();
    for expected in [
        "/host/hostname",
        "/host/os",
        "/cpu/online",
        "/cpu/numa_nodes/0/cpulist",
        "/pci/0000:01:00.0/numa_node",
        "/pci/0000:02:00.0/class",
        "/rdma/devices/mlx5_0/ports/1/state",
        "/rdma/devices/mlx5_0/ports/1/rate",
        "/rdma/devices/mlx5_0/ports/1/gids/1",
        "/network/interfaces/ibp3s0/mtu",
    ] {
        assert!(
            fields.contains(&expected),
            "no error for {expected}; got {fields:?}"
        );
    }
    let port = &f.rdma.devices[0].ports[0];
    assert_eq!(port.state, "UNKNOWN");
    assert_eq!(port.state_raw.as_deref(), Some("9: WEIRD"));
    assert_eq!(
        port.gids.len(),
        1,
        "the unparsable GID is dropped, the good one kept"
    );
    // The GPU is still inventoried, only its NUMA node is unknown.
    assert_eq!(f.gpus.len(), 1);
    assert_eq!(f.gpus[0].name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(f.gpus[0].numa_node, None);
}

#[test]
fn same_tree_gives_the_same_hash() {
    for name in [
        "dgx1",
        "azure-nd40rs-v2",
        "runai-roce-pod",
        "ethernet-box",
        "garbage",
    ] {
        let (a, b) = (facts(name), facts(name));
        assert_eq!(facts_sha256(&a), facts_sha256(&b), "{name}");
        assert_eq!(
            serde_json::to_value(&a.gpus).unwrap(),
            serde_json::to_value(&b.gpus).unwrap()
        );
    }
    assert_ne!(
        facts_sha256(&facts("dgx1")),
        facts_sha256(&facts("ethernet-box"))
    );
}

#[test]
fn facts_round_trip_and_tolerate_unknown_fields() {
    let f = facts("runai-roce-pod");
    let mut value = serde_json::to_value(&f).unwrap();
    value["a_field_from_a_newer_agent"] = serde_json::json!({"x": 1});
    value["rdma"]["devices"][0]["ports"][0]["new_counter"] = serde_json::json!(7);
    let back: NodeFacts = serde_json::from_value(value).unwrap();
    assert_eq!(back, f);
}

#[test]
fn server_filter_paths_exist_with_the_right_types() {
    let v = serde_json::to_value(facts("azure-nd40rs-v2")).unwrap();
    assert!(v.pointer("/host/hostname").unwrap().is_string());
    assert!(v.pointer("/gpus/0/name").unwrap().is_string());
    assert!(v.pointer("/rdma/devices/0/name").unwrap().is_string());
    assert_eq!(
        v.pointer("/rdma/devices/0/ports/0/state").unwrap(),
        "ACTIVE"
    );
    assert_eq!(
        v.pointer("/rdma/devices/0/ports/0/link_layer").unwrap(),
        "InfiniBand"
    );
    assert_eq!(v.pointer("/schema_version").unwrap(), 1);
    let at = v.pointer("/collected_at").unwrap().as_str().unwrap();
    chrono::DateTime::parse_from_rfc3339(at).unwrap();
}

/// A capture of `heddle-agent facts` on a live 2×H200 node (NVML, NCCL and libibverbs
/// present, no HCA). It must keep deserializing as the types evolve.
#[test]
fn real_h200_capture_still_deserializes() {
    let text = std::fs::read_to_string(fixture("h200x2-real.json")).unwrap();
    let f: NodeFacts = serde_json::from_str(&text).unwrap();
    assert_eq!(f.nvml.state, ProbeState::Available);
    assert_eq!(f.gpus.len(), 2);
    assert!(
        f.gpus
            .iter()
            .all(|g| g.name.as_deref() == Some("NVIDIA H200")
                && g.nvlinks.len() == 18
                && g.uuid.is_some())
    );
    assert_eq!(
        f.topology.matrix,
        vec![vec!["X", "NV18"], vec!["NV18", "X"]]
    );
    assert!(f.software.nccl.is_some());
}

/// The 2×H200 VM whose hypervisor hides the NVSwitches: NVML answers `ffffffff:ff:ff.0`
/// for every link's far end, so each link's peer comes from NVML's P2P status over NVLink
/// and says it was inferred; the matrix is `topo -m`'s NV18.
#[test]
fn h200_vm_links_take_their_peer_from_p2p_status() {
    let f = facts("h200x2-vm");
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    assert_eq!(f.gpus.len(), 2);
    for (gpu, peer) in f.gpus.iter().zip(["0000:00:07.0", "0000:00:06.0"]) {
        assert_eq!(gpu.name.as_deref(), Some("NVIDIA H200"), "{gpu:?}");
        assert_eq!(gpu.nvlinks.len(), 18);
        assert!(
            gpu.nvlinks.iter().all(|l| l.remote_bdf.is_none()
                && l.remote_kind.as_deref() == Some("switch")
                && l.peer_inferred
                && l.peers == [peer]),
            "{:?}",
            gpu.nvlinks[0]
        );
    }
    assert_eq!(
        f.topology.matrix,
        vec![vec!["X", "NV18"], vec!["NV18", "X"]]
    );
    assert!(
        f.topology.nvlink_source.contains("nvml-nvlinks.json"),
        "{}",
        f.topology.nvlink_source
    );
    let json = serde_json::to_value(&f.gpus[0].nvlinks[0]).unwrap();
    assert_eq!(json["peer_inferred"], true);
    assert_eq!(json["peers"], serde_json::json!(["0000:00:07.0"]));
}

#[test]
fn bare_metal_ib12_keeps_twelve_hcas_and_the_down_port() {
    let f = snapshot("bare-metal-ib12");
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    let names: Vec<_> = f.rdma.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
            "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"
        ]
    );
    let down = &f.rdma.devices[7].ports[0];
    assert_eq!(
        (down.state.as_str(), down.phys_state.as_deref()),
        ("DOWN", Some("2: Polling"))
    );
    let idx = |n: &str| f.topology.devices.iter().position(|d| d == n).unwrap();
    let cell = |a: &str, b: &str| f.topology.matrix[idx(a)][idx(b)].as_str();
    assert_eq!(cell("GPU0", "mlx5_0"), "PIX");
    assert_eq!(cell("GPU0", "mlx5_1"), "PXB");
    assert_eq!(cell("GPU5", "mlx5_7"), "PIX");
    assert_eq!(cell("GPU0", "mlx5_4"), "NODE");
    assert_eq!(cell("GPU0", "mlx5_10"), "SYS");
}

#[test]
fn azure_ndv4_has_eight_ib_vfs_and_the_accelerated_networking_vf() {
    let f = snapshot("azure-ndv4");
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    assert_eq!(f.rdma.devices.len(), 9);
    assert_eq!(f.gpus.len(), 8);
    let an = f
        .rdma
        .devices
        .iter()
        .find(|d| d.name == "mlx5_an0")
        .unwrap();
    assert_eq!(an.ports[0].link_layer.as_deref(), Some("Ethernet"));
    let vf = f
        .network
        .interfaces
        .iter()
        .find(|i| i.name == "enP23147s1")
        .unwrap();
    assert_eq!(vf.master.as_deref(), Some("eth0"));
}

#[test]
fn runai_pod_with_two_hcas_sees_the_hosts_gids_too() {
    let f = snapshot("runai-roce-pod-2hca");
    assert!(f.errors.is_empty(), "{:?}", f.errors);
    let bond1 = &f.rdma.devices[1];
    assert_eq!(bond1.name, "mlx5_bond_1");
    let v2_ipv4: Vec<_> = bond1.ports[0]
        .gids
        .iter()
        .filter(|g| g.gid_type.as_deref() == Some("RoCE v2") && g.ipv4.is_some())
        .map(|g| (g.index, g.ndev.as_deref().unwrap()))
        .collect();
    assert_eq!(v2_ipv4, [(3, "bond1"), (7, "net2")]);
}
