use super::*;
use crate::facts::cpulist::MAX_CPUS;

/// The node's merged recommendations and its GPU map, from a fixture tree.
fn detected(tree: &str) -> (BTreeMap<String, String>, GpuMap) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(tree);
    let facts = crate::facts::collect(&crate::facts::CollectOptions::for_root(&root));
    let out = gpu_map::detect_facts(&facts, None).unwrap();
    assert_eq!(out.failures(), 0);
    let map = GpuMap::from_detected(&out, &facts, &root);
    (out.env, map)
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn each_dgx1_rank_gets_its_gpu_cpus_numa_and_hca() {
    let (d, map) = detected("dgx1");
    let p = plan(2, &d, &map, &env(&[])).unwrap();
    assert_eq!((p.gpu, p.cpus.as_str(), p.numa), (2, "0-19,40-59", Some(0)));
    assert_eq!(p.hca.as_deref(), Some("mlx5_1"));
    assert_eq!(p.netdev.as_deref(), Some("ib1"));
    assert_eq!(p.env["UCX_NET_DEVICES"], "mlx5_1:1");
    assert_eq!(p.env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    // The node-wide list stays for NCCL.
    assert_eq!(p.env["NCCL_IB_HCA"], "=mlx5_0,mlx5_1,mlx5_2,mlx5_3");
    // The seed's launcher: interface "ib" + str(gpu // 2), CPUs of the GPU's socket.
    for rank in 0..8 {
        let p = plan(rank, &d, &map, &env(&[])).unwrap();
        assert_eq!(p.netdev, Some(format!("ib{}", rank / 2)));
        assert_eq!(p.numa, Some(if rank < 4 { 0 } else { 1 }));
    }
}

#[test]
fn visible_devices_renumber_and_the_callers_choices_win() {
    let (d, map) = detected("dgx1");
    let caller = env(&[("CUDA_VISIBLE_DEVICES", "4,5"), ("UCX_TLS", "tcp")]);
    let p = plan(1, &d, &map, &caller).unwrap();
    assert_eq!((p.gpu, p.numa), (5, Some(1)));
    assert_eq!(p.hca.as_deref(), Some("mlx5_2"));
    assert!(!p.env.contains_key("UCX_TLS"));
    assert!(plan(2, &d, &map, &caller).is_err());
    assert!(plan(9, &d, &map, &env(&[])).is_err());
}

#[test]
fn a_rank_whose_hca_is_down_gets_the_next_usable_one_behind_its_switch() {
    let (d, map) = detected("bare-metal-ib12");
    // GPU5's own HCA, mlx5_7, has its port DOWN; mlx5_6 shares the upper switch (PXB).
    let p = plan(5, &d, &map, &env(&[])).unwrap();
    assert_eq!(p.hca.as_deref(), Some("mlx5_6"));
    assert_eq!(p.env["UCX_NET_DEVICES"], "mlx5_6:1");
    let p = plan(4, &d, &map, &env(&[])).unwrap();
    assert_eq!(p.hca.as_deref(), Some("mlx5_6"));
    assert_eq!(p.env["UCX_NET_DEVICES"], "mlx5_6:1");
}

#[test]
fn cpulists_parse_like_the_kernel_writes_them() {
    assert_eq!(parse_cpulist("0-2,8").unwrap(), [0, 1, 2, 8]);
    assert_eq!(parse_cpulist("").unwrap(), Vec::<usize>::new());
    assert!(parse_cpulist("3-1").is_err());
    assert!(parse_cpulist("x").is_err());
    // A few bytes per range must not become 65536 numbers each, again and again.
    let repeated = vec!["0-65535"; 1000].join(",");
    assert!(parse_cpulist(&repeated).is_err());
    assert!(parse_cpulist(&vec!["7"; MAX_CPUS + 1].join(",")).is_err());
    assert_eq!(parse_cpulist("0-65535").unwrap().len(), MAX_CPUS);
}

#[test]
fn rank_comes_from_the_launchers_variables() {
    assert_eq!(rank_from_env(&env(&[("SLURM_LOCALID", "3")])), Some(3));
    assert_eq!(
        rank_from_env(&env(&[("OMPI_COMM_WORLD_LOCAL_RANK", "1")])),
        Some(1)
    );
    assert_eq!(rank_from_env(&env(&[])), None);
}
