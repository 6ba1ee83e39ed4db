//! `heddle-agent facts` on the machine running the tests. Whatever hardware it has, the
//! command must succeed and state plainly what is missing.

use std::path::Path;
use std::process::Command;

use heddle_agent::facts::{CollectOptions, collect};
use heddle_types::facts::{NodeFacts, ProbeState};

const BIN: &str = env!("CARGO_BIN_EXE_heddle-agent");

#[test]
fn facts_on_this_machine_succeeds_and_names_what_is_missing() {
    let out = Command::new(BIN).args(["facts"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}; stderr: {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let facts: NodeFacts = serde_json::from_slice(&out.stdout).expect("stdout is the facts JSON");
    assert!(facts.live);
    assert!(!facts.host.hostname.is_empty());
    assert!(facts.cpu.online_count.unwrap_or(0) >= 1);
    assert!(facts.network.interfaces.iter().any(|i| i.name == "lo"));

    if facts.nvml.state != ProbeState::Available {
        assert!(
            facts.nvml.message.starts_with("no NVML"),
            "{}",
            facts.nvml.message
        );
        assert!(facts.gpus.iter().all(|g| g.uuid.is_none()));
    }
    if !Path::new("/sys/class/infiniband").exists() {
        assert_eq!(facts.rdma.sysfs.state, ProbeState::Missing);
        assert!(
            facts.rdma.sysfs.message.starts_with("no RDMA devices"),
            "{}",
            facts.rdma.sysfs.message
        );
        assert!(facts.rdma.devices.is_empty());
    }
    if !facts.rdma.verbs.message.starts_with("no libibverbs") {
        let rdma_core = facts.software.rdma_core.as_deref();
        assert!(
            rdma_core.is_some_and(|v| v.chars().next().unwrap().is_ascii_digit()),
            "libibverbs loaded but no rdma-core version: {rdma_core:?}"
        );
    }
    match facts.rdma.verbs.state {
        ProbeState::Missing => assert!(
            facts.rdma.verbs.message.starts_with("no libibverbs")
                || facts.rdma.verbs.message.contains("found no RDMA devices"),
            "{}",
            facts.rdma.verbs.message
        ),
        ProbeState::Available => assert!(facts.rdma.verbs.message.starts_with("libibverbs lists")),
        other => panic!(
            "unexpected verbs state {other:?}: {}",
            facts.rdma.verbs.message
        ),
    }
}

#[test]
fn without_the_libraries_the_facts_say_so() {
    let opts = CollectOptions {
        nvml_library: Some("libnvidia-ml-absent.so.1".into()),
        verbs_library: "libibverbs-absent.so.1".into(),
        nccl_library: "libnccl-absent.so.2".into(),
        ..CollectOptions::default()
    };
    let facts = collect(&opts);
    assert_eq!(facts.nvml.state, ProbeState::Missing);
    assert!(facts.nvml.message.starts_with("no NVML"));
    assert_eq!(facts.rdma.verbs.state, ProbeState::Missing);
    assert!(
        facts.rdma.verbs.message.starts_with("no libibverbs"),
        "{}",
        facts.rdma.verbs.message
    );
    let nccl = facts.software.nccl_probe.unwrap();
    assert!(nccl.message.starts_with("no NCCL"));
    assert_eq!(
        facts.topology.nvlink_source.split(':').next(),
        Some("no NVML")
    );
}

#[test]
fn pretty_and_topo_outputs_work_on_a_fixture() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dgx1");
    let out = Command::new(BIN)
        .args(["facts", "--root", root, "--topo"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines().next().unwrap().contains("GPU0\tGPU1"),
        "{text}"
    );
    assert!(text.contains("mlx5_0\tPIX\tPIX\tPHB\tPHB\tSYS"), "{text}");
    let out = Command::new(BIN)
        .args(["facts", "--root", root, "--pretty"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .starts_with("{\n  \"schema_version\": 1,")
    );
}

#[test]
fn a_missing_root_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["facts", "--root", "/nonexistent/heddle-root"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
}

/// The binary must start on nodes without rdma-core, the NVIDIA driver or NCCL, so none
/// of them may be a link-time dependency.
#[test]
fn binary_does_not_link_gpu_or_rdma_libraries() {
    let out = Command::new("ldd")
        .arg(BIN)
        .output()
        .expect("ldd (libc-bin) is needed for this test");
    let deps = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ldd failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for lib in [
        "libibverbs",
        "librdmacm",
        "libnvidia-ml",
        "libnccl",
        "libcuda",
    ] {
        assert!(!deps.contains(lib), "{BIN} links {lib}:\n{deps}");
    }
}
