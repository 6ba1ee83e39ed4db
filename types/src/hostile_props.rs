//! Property tests of the parsers in this crate that read what someone else wrote: the
//! node env file and NCCL conf files (`nccl_conf`), the profiler's spool files (`observe`),
//! the env policy every value passes (`env_policy`), and the fabric's readers (the Heddle
//! fabric file, `topology.conf`, `ibnetdiscover` output). Arbitrary bytes and mutations of
//! real inputs must give an answer — never a panic — and what a writer produces must read
//! back equal.

use heddle_testkit::props::mutated_bytes as mutated;
use proptest::prelude::*;

use crate::fabric::{self, import};
use crate::{env_policy, nccl_conf, observe};

const CONF: &str = "# written by heddle-agent; do not edit\n# node gpu-1\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\nNCCL_SOCKET_IFNAME=eth0\nUCX_NET_DEVICES=mlx5_0:1\nNCCL_PROFILER_PLUGIN=/usr/lib/heddle/libnccl-profiler-heddle.so\n";

fn spool_sample() -> Vec<u8> {
    br#"{"format":1,"job":{"pid":4242,"uid":1000,"start_ticks":1234,"slurm_job_id":"77","comm":"python3"},"seq":3,"final":false,"written_at":"2026-11-27T12:00:00Z","plugin_version":"0.1.0","nccl_version":"2.28.9","comms":[{"comm_hash":"9f3a2b","nranks":2,"nnodes":1,"rank":0,"ops":[{"func":"AllReduce","size_band":30,"ops":20,"bytes":21474836480,"time_ns":90000000,"algos":{"Ring":20},"protos":{"Simple":20},"max_channels":16}],"net":[{"net":"Socket","ops":4,"bytes":4096}]}],"dropped_events":0,"dropped_comms":0}"#.to_vec()
}

fn entry() -> impl Strategy<Value = nccl_conf::Entry> {
    ("[A-Z_][A-Z0-9_]{0,30}", "[ -~é→µ]{0,60}")
        .prop_map(|(name, value)| nccl_conf::Entry { name, value })
}

const IBNET: &str = include_str!("../tests/fixtures/fabric/ibnetdiscover-rdma-core-manual.txt");
const TOPOLOGY: &str = "SwitchName=s0 Nodes=dev[0-5]\nSwitchName=s1 Nodes=dev[6-11]\nSwitchName=s3 Switches=s[0-1] LinkSpeed=100\n";
const FABRIC: &str = r#"{"nodes": [{"name": "n0001", "nics": [{"name": "mlx5_0", "rail": 0, "leaf": "leaf-su0-r0", "gbps": 400}]}], "switches": [{"name": "leaf-su0-r0", "tier": "leaf"}, {"name": "spine-00", "tier": "spine"}], "links": [{"a": "leaf-su0-r0", "b": "spine-00", "gbps": 400}]}"#;

proptest! {
    #[test]
    fn fabric_readers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = import::slurm_topology(&text);
        let _ = import::ibnetdiscover(&text);
        let _ = fabric::Fabric::from_json(&bytes);
    }

    #[test]
    fn fabric_mutations_are_read_or_refused(
        ib in mutated(IBNET.as_bytes().to_vec()),
        topo in mutated(TOPOLOGY.as_bytes().to_vec()),
        file in mutated(FABRIC.as_bytes().to_vec()),
    ) {
        // Whatever an importer accepts is a fabric that passes its own checks, and reads
        // back from its JSON unchanged.
        for f in [import::ibnetdiscover(&String::from_utf8_lossy(&ib)), import::slurm_topology(&String::from_utf8_lossy(&topo))]
            .into_iter()
            .flatten()
        {
            prop_assert!(f.check().is_ok());
            let again = fabric::Fabric::from_json(&serde_json::to_vec(&f).unwrap()).unwrap();
            prop_assert_eq!(again, f);
        }
        if let Ok(f) = fabric::Fabric::from_json(&file) {
            let _ = fabric::index::Index::new(&f);
        }
    }

    #[test]
    fn conf_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(entries) = nccl_conf::parse(&bytes) {
            // What was accepted renders and reads back the same.
            let text = nccl_conf::render(&[], &entries).unwrap();
            prop_assert_eq!(nccl_conf::parse(text.as_bytes()).unwrap(), entries);
        }
    }

    #[test]
    fn conf_mutations_never_panic(bytes in mutated(CONF.as_bytes().to_vec())) {
        if let Ok(entries) = nccl_conf::parse(&bytes) {
            for e in &entries {
                prop_assert!(!e.value.chars().any(env_policy::is_hidden));
                prop_assert!(e.value.len() <= nccl_conf::MAX_CONF_VALUE_LEN);
            }
        }
    }

    #[test]
    fn conf_render_round_trips(entries in proptest::collection::btree_map("[A-Z_][A-Z0-9_]{0,30}", entry(), 0..40)) {
        let entries: Vec<_> = entries.into_values().collect::<Vec<_>>();
        // Names may repeat across generated entries; keep the first of each.
        let mut seen = std::collections::BTreeSet::new();
        let entries: Vec<_> = entries.into_iter().filter(|e| seen.insert(e.name.clone())).collect();
        let text = nccl_conf::render(&["node x"], &entries).unwrap();
        prop_assert_eq!(nccl_conf::parse(text.as_bytes()).unwrap(), entries);
    }

    #[test]
    fn spool_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = observe::SpoolFile::parse(&bytes);
    }

    #[test]
    fn spool_mutations_are_parsed_or_refused(bytes in mutated(spool_sample())) {
        if let Ok(file) = observe::SpoolFile::parse(&bytes) {
            prop_assert!(file.check().is_ok());
            let again = serde_json::to_vec(&file).unwrap();
            prop_assert_eq!(observe::SpoolFile::parse(&again).unwrap(), file);
        }
    }

    #[test]
    fn policy_exports_only_visible_quoted_text(name in "\\PC{0,40}", value in "\\PC{0,80}") {
        if let Ok(line) = env_policy::export_line(&name, &value) {
            prop_assert!(line.starts_with("export ") && line.ends_with('\n'));
            prop_assert!(!line[..line.len() - 1].chars().any(env_policy::is_hidden));
        }
    }
}

#[test]
fn the_samples_are_valid() {
    assert_eq!(import::ibnetdiscover(IBNET).unwrap().nodes.len(), 4);
    assert_eq!(import::slurm_topology(TOPOLOGY).unwrap().nodes.len(), 12);
    fabric::Fabric::from_json(FABRIC.as_bytes()).unwrap();
    assert_eq!(nccl_conf::parse(CONF.as_bytes()).unwrap().len(), 4);
    observe::SpoolFile::parse(&spool_sample()).unwrap();
}
