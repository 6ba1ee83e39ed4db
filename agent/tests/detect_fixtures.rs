//! The environment the first-party plugins recommend on each machine shape of the runbooks
//! (fixture trees under `tests/fixtures`, facts collected as on the machine, plugins run as
//! WebAssembly through the bundled components), snapshot-tested, plus what the runbooks'
//! authors worked out by hand and invariants that hold on every shape: no dead port, no
//! prefix-matching HCA list, no Ethernet accelerated-networking device.

use std::fmt::Write as _;
use std::path::PathBuf;

use heddle_agent::detect::{self, DetectOutput};
use heddle_agent::facts::{CollectOptions, collect};
use heddle_plugin_host::{HostConfig, Limits, PluginHost};
use heddle_types::facts::NodeFacts;
use heddle_types::recommend::{Candidate, Rank, resolve};

fn run(tree: &str) -> (NodeFacts, DetectOutput) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(tree);
    let facts = collect(&CollectOptions::for_root(root));
    let host = PluginHost::new(HostConfig::default()).unwrap();
    let out = detect::detect(
        &host,
        &detect::builtin(),
        &serde_json::to_string(&facts).unwrap(),
        &Limits::default(),
    );
    assert_eq!(out.failures(), 0, "{tree}");
    check_invariants(tree, &facts, &out);
    (facts, out)
}

/// What `heddle env --explain` would print for the node, then every warning and the
/// per-GPU map: the text a reader checks against the runbook.
fn render(out: &DetectOutput) -> String {
    let candidates = out.plugins.iter().flat_map(|p| {
        p.env.iter().map(|e| Candidate {
            name: e.name.clone(),
            value: e.value.clone(),
            reason: e.reason.clone(),
            source: p.name.clone(),
            rank: Rank::plugin(&p.name),
        })
    });
    let mut text = String::new();
    for v in resolve(candidates) {
        writeln!(
            text,
            "export {}={}",
            v.name,
            heddle_types::env_policy::shell_quote(&v.value).unwrap()
        )
        .unwrap();
        writeln!(text, "    # {}: {}", v.source, v.reason).unwrap();
        for o in &v.overridden {
            writeln!(
                text,
                "    # overrode {}={} from {}",
                v.name, o.value, o.source
            )
            .unwrap();
        }
    }
    for p in &out.plugins {
        for w in &p.warnings {
            writeln!(text, "warning {}: {w}", p.name).unwrap();
        }
        for a in &p.affinity {
            writeln!(
                text,
                "affinity {}: GPU{} cpus={} numa={} hca={} netdev={}",
                p.name,
                a.gpu,
                a.cpus,
                a.numa.map_or("-".into(), |n| n.to_string()),
                a.nic.as_deref().unwrap_or("-"),
                a.netdev.as_deref().unwrap_or("-")
            )
            .unwrap();
        }
    }
    text
}

/// Holds on every shape: HCA lists are exact-match, and every device or port they name has
/// an ACTIVE, LinkUp port; interface lists are exact-match too.
fn check_invariants(tree: &str, facts: &NodeFacts, out: &DetectOutput) {
    let usable = |dev: &str, port: Option<u32>| {
        facts.rdma.devices.iter().any(|d| {
            d.name == dev
                && d.ports.iter().any(|p| {
                    port.is_none_or(|n| n == p.port)
                        && p.state == "ACTIVE"
                        && p.phys_state.as_deref().is_none_or(|s| s.contains("LinkUp"))
                })
        })
    };
    let entry = |item: &str| {
        let (dev, port) = match item.split_once(':') {
            Some((d, p)) => (d.to_string(), Some(p.parse::<u32>().unwrap())),
            None => (item.to_string(), None),
        };
        (dev, port)
    };
    if let Some(hca) = out.env.get("NCCL_IB_HCA") {
        let list = hca
            .strip_prefix('=')
            .unwrap_or_else(|| panic!("{tree}: NCCL_IB_HCA={hca} is a prefix match"));
        for item in list.split(',') {
            let (dev, port) = entry(item);
            assert!(
                usable(&dev, port),
                "{tree}: NCCL_IB_HCA names {item}, which is not usable"
            );
        }
    }
    if let Some(ucx) = out.env.get("UCX_NET_DEVICES") {
        for item in ucx.split(',') {
            let (dev, port) = entry(item);
            assert!(port.is_some(), "{tree}: UCX device {item} without a port");
            assert!(
                usable(&dev, port),
                "{tree}: UCX_NET_DEVICES names {item}, which is not usable"
            );
        }
    }
    if let Some(ifname) = out.env.get("NCCL_SOCKET_IFNAME") {
        let list = ifname
            .strip_prefix('=')
            .unwrap_or_else(|| panic!("{tree}: {ifname} is a prefix"));
        for name in list.split(',') {
            let i = facts.network.interfaces.iter().find(|i| i.name == name);
            assert!(
                i.is_some_and(|i| i.operstate.as_deref() == Some("up")),
                "{tree}: NCCL_SOCKET_IFNAME names {name}, which is not up"
            );
        }
    }
}

#[test]
fn azure_nd40rs_v2() {
    let (_, out) = run("azure-nd40rs-v2");
    // Seed 001: mlx5_0 only, never the accelerated-networking rdmaP device; IPoIB is down in
    // the capture, so the bootstrap goes over eth0.
    assert_eq!(out.env["NCCL_IB_HCA"], "=mlx5_0");
    assert_eq!(out.env["NCCL_SOCKET_IFNAME"], "=eth0");
    assert_eq!(out.env["UCX_NET_DEVICES"], "mlx5_0:1");
    assert!(out.env.values().all(|v| !v.contains("rdmaP")));
    insta::assert_snapshot!("env_azure_nd40rs_v2", render(&out));
}

#[test]
fn azure_ndv4() {
    let (_, out) = run("azure-ndv4");
    assert_eq!(
        out.env["NCCL_IB_HCA"],
        "=mlx5_ib0,mlx5_ib1,mlx5_ib2,mlx5_ib3,mlx5_ib4,mlx5_ib5,mlx5_ib6,mlx5_ib7"
    );
    assert_eq!(out.env["NCCL_SOCKET_IFNAME"], "=ib0");
    assert!(out.env.values().all(|v| !v.contains("mlx5_an0")));
    let azure = out.plugins.iter().find(|p| p.name == "azure-nd").unwrap();
    assert_eq!(azure.traits["azure.sku"], "ND96asr_v4");
    insta::assert_snapshot!("env_azure_ndv4", render(&out));
}

#[test]
fn runai_roce_pod() {
    let (_, out) = run("runai-roce-pod");
    // Seed 003: the IPv4 RoCE v2 GID is index 9, on the Multus interface.
    assert_eq!(out.env["NCCL_IB_GID_INDEX"], "9");
    assert_eq!(out.env["NCCL_IB_HCA"], "=mlx5_bond_0");
    assert_eq!(out.env["NCCL_SOCKET_IFNAME"], "=net1");
    assert_eq!(out.env["NCCL_SOCKET_NTHREADS"], "4");
    assert_eq!(out.env["NCCL_NSOCKS_PERTHREAD"], "8");
    insta::assert_snapshot!("env_runai_roce_pod", render(&out));
}

#[test]
fn runai_roce_pod_with_two_hcas() {
    let (_, out) = run("runai-roce-pod-2hca");
    // mlx5_bond_1's lowest IPv4 RoCE v2 GID (3) is the host's bond1; the pod's is 7, and
    // mlx5_bond_0's is 9: no single index, and NCCL's own choice would take 3.
    assert_ne!(
        out.env.get("NCCL_IB_GID_INDEX").map(String::as_str),
        Some("3")
    );
    let roce = out.plugins.iter().find(|p| p.name == "runai-roce").unwrap();
    assert!(
        roce.warnings
            .iter()
            .any(|w| w.contains("mlx5_bond_0 uses 9, mlx5_bond_1 uses 7")),
        "{:?}",
        roce.warnings
    );
    insta::assert_snapshot!("env_runai_roce_pod_2hca", render(&out));
}

#[test]
fn dgx1() {
    let (_, out) = run("dgx1");
    // Seeds 000 and 004: four EDR HCAs, rc plus the CUDA transports, ib0 for the bootstrap.
    assert_eq!(out.env["NCCL_IB_HCA"], "=mlx5_0,mlx5_1,mlx5_2,mlx5_3");
    assert_eq!(
        out.env["UCX_NET_DEVICES"],
        "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    );
    assert_eq!(out.env["UCX_TLS"], "rc,cuda_copy,cuda_ipc");
    assert_eq!(out.env["NCCL_SOCKET_IFNAME"], "=ib0");
    insta::assert_snapshot!("env_dgx1", render(&out));
}

#[test]
fn bare_metal_ib_with_twelve_hcas_and_a_down_port() {
    let (_, out) = run("bare-metal-ib12");
    // The GPU-local compute HCAs but mlx5_7, whose port is DOWN; exact names, so mlx5_1 does
    // not also take the Ethernet mlx5_10 and mlx5_11.
    assert_eq!(
        out.env["NCCL_IB_HCA"],
        "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_8,mlx5_9"
    );
    assert_eq!(out.env["NCCL_SOCKET_IFNAME"], "=ib0");
    let dgx = out
        .plugins
        .iter()
        .find(|p| p.name == "dgx-affinity")
        .unwrap();
    assert!(
        dgx.warnings
            .iter()
            .any(|w| w.contains("mlx5_7 port 1 is DOWN (physical state 2: Polling)")),
        "{:?}",
        dgx.warnings
    );
    insta::assert_snapshot!("env_bare_metal_ib12", render(&out));
}

#[test]
fn plain_ethernet_gets_nothing() {
    let (_, out) = run("ethernet-box");
    assert!(out.env.is_empty(), "{:?}", out.env);
    insta::assert_snapshot!("env_ethernet_box", render(&out));
}
