//! The node checks (`heddle_types::node_checks`) on the facts of each fixture tree, as the
//! server evaluates them on a first report: one line per check, snapshot-tested, plus what
//! each planted fault must give.

use std::path::PathBuf;

use heddle_agent::facts::{CollectOptions, collect};
use heddle_types::facts::NodeFacts;
use heddle_types::health::Verdict;
use heddle_types::node_checks::{NodeCheck, evaluate};

const FIXTURES: [&str; 8] = [
    "azure-nd40rs-v2",
    "azure-ndv4",
    "bare-metal-ib12",
    "dgx1",
    "ethernet-box",
    "garbage",
    "runai-roce-pod",
    "runai-roce-pod-2hca",
];

fn facts(name: &str) -> NodeFacts {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    collect(&CollectOptions::for_root(root))
}

fn render(checks: &[NodeCheck]) -> String {
    checks
        .iter()
        .map(|c| {
            format!(
                "{:<7} {} {}: {}\n",
                c.state,
                c.name,
                c.subject.as_deref().unwrap_or("-"),
                c.reason
            )
        })
        .collect()
}

#[test]
fn checks_of_every_fixture() {
    for name in FIXTURES {
        let checks = evaluate(&facts(name), None);
        insta::assert_snapshot!(format!("checks_{name}"), render(&checks));
    }
}

fn one<'a>(checks: &'a [NodeCheck], name: &str, subject: &str) -> &'a NodeCheck {
    checks
        .iter()
        .find(|c| c.name == name && c.subject.as_deref() == Some(subject))
        .unwrap_or_else(|| panic!("no {name} for {subject} in\n{}", render(checks)))
}

#[test]
fn bare_metal_faults_are_found() {
    let f = facts("bare-metal-ib12");
    let checks = evaluate(&f, None);
    let link = one(&checks, "gpu-pcie-link", "GPU3 0000:40:00.0");
    assert_eq!(link.state, Verdict::Warn);
    assert!(
        link.reason.contains("Gen3 x8, below its maximum Gen5 x16"),
        "{}",
        link.reason
    );
    assert_eq!(
        one(&checks, "gpu-pcie-link", "GPU2 0000:3c:00.0").state,
        Verdict::Pass
    );
    assert_eq!(
        one(&checks, "gpu-power-cap", "GPU1 0000:1e:00.0").state,
        Verdict::Warn
    );
    assert_eq!(
        one(&checks, "gpu-throttle", "GPU4 0000:9c:00.0").state,
        Verdict::Warn
    );
    assert_eq!(
        one(&checks, "gpu-ecc", "GPU6 0000:bc:00.0").state,
        Verdict::Warn
    );
    assert_eq!(
        one(&checks, "gpu-processes", "GPU7 0000:c0:00.0").state,
        Verdict::Warn
    );
    let xid = one(&checks, "gpu-xid", "GPU2 0000:3c:00.0");
    assert_eq!(xid.state, Verdict::Warn);
    assert!(
        xid.reason.starts_with("Xid 13 in the kernel log"),
        "{}",
        xid.reason
    );
    let port = one(&checks, "ib-port-errors", "mlx5_3:1");
    assert_eq!(port.state, Verdict::Warn);
    assert!(
        port.reason.starts_with(
            "symbol_error +37, link_downed +1, port_rcv_errors +5, link_error_recovery +2"
        ),
        "{}",
        port.reason
    );
    assert_eq!(
        one(&checks, "ib-port-errors", "mlx5_0:1").state,
        Verdict::Pass
    );
    assert_eq!(
        one(&checks, "ib-phys-state", "mlx5_7:1").state,
        Verdict::Warn
    );
    let bond = one(&checks, "bond-members", "bond0");
    assert_eq!(bond.state, Verdict::Warn);
    assert!(
        bond.reason.starts_with("member(s) eno3 down of 2"),
        "{}",
        bond.reason
    );
    let conf = one(&checks, "nccl-conf", "/etc/nccl.conf");
    assert_eq!(conf.state, Verdict::Warn);
    assert!(
        conf.reason
            .contains("NCCL_IB_HCA=mlx5 NCCL_SOCKET_IFNAME=eno1"),
        "{}",
        conf.reason
    );
    // Bare metal has no container, so no rdma-core comparison.
    assert!(!checks.iter().any(|c| c.name == "rdma-core"));

    // The next report: mlx5_3 took four more symbol errors, nothing else moved.
    let mut later = f.clone();
    let c = later.conditions.as_mut().unwrap();
    let port = c
        .ib_counters
        .iter_mut()
        .find(|p| p.device == "mlx5_3")
        .unwrap();
    port.symbol_error = Some(41);
    let checks = evaluate(&later, Some(&f));
    let port = one(&checks, "ib-port-errors", "mlx5_3:1");
    assert_eq!(
        port.reason.split(':').next().unwrap(),
        "symbol_error +4 since the last report"
    );
    // The Xid 13 was in the previous report already: nothing new since.
    let xid: Vec<_> = checks.iter().filter(|c| c.name == "gpu-xid").collect();
    assert_eq!(xid.len(), 1);
    assert_eq!(
        (xid[0].state, xid[0].subject.as_deref()),
        (Verdict::Pass, None)
    );
}

#[test]
fn container_rdma_core_is_compared_with_the_host_kernel() {
    let old = evaluate(&facts("runai-roce-pod-2hca"), None);
    let c = old.iter().find(|c| c.name == "rdma-core").unwrap();
    assert_eq!(c.state, Verdict::Warn, "{}", c.reason);
    assert!(
        c.reason
            .contains("rdma-core 28.0 is older than the host's kernel 5.15.0-105-generic")
    );
    let new = evaluate(&facts("runai-roce-pod"), None);
    let c = new.iter().find(|c| c.name == "rdma-core").unwrap();
    assert_eq!(c.state, Verdict::Pass, "{}", c.reason);
}

#[test]
fn fixtures_without_nvml_data_say_so() {
    let checks = evaluate(&facts("dgx1"), None);
    let ecc = checks.iter().find(|c| c.name == "gpu-ecc").unwrap();
    assert_eq!(ecc.state, Verdict::Unknown);
    assert!(ecc.reason.contains("no NVML fixture"), "{}", ecc.reason);
    // Full-width links at the V100's generation pass.
    assert!(
        checks
            .iter()
            .filter(|c| c.name == "gpu-pcie-link")
            .all(|c| c.state == Verdict::Pass && c.reason.contains("Gen3 x16"))
    );
}
