use super::*;
use heddle_plugin_sdk::serde_json::Value;
use heddle_plugin_sdk::serde_json::{self, json};

const SEED_003: &str = include_str!("../../../fixtures/runai-roce.json");

fn seed() -> Value {
    serde_json::from_str(SEED_003).unwrap()
}

fn detect(v: &Value) -> Detection {
    heddle_plugin_sdk::run::<RunaiRoce>(&v.to_string()).unwrap()
}

fn gids(f: &mut Value) -> &mut Vec<Value> {
    f["rdma"]["devices"][0]["ports"][0]["gids"]
        .as_array_mut()
        .unwrap()
}

fn warned(d: &Detection, text: &str) -> bool {
    d.warnings.iter().any(|w| w.contains(text))
}

#[test]
fn picks_the_roce_v2_ipv4_gid_like_the_seed() {
    let d = detect(&seed());
    assert_eq!(d.trait_value("orchestrator"), Some("runai"));
    assert_eq!(d.trait_value("rdma.fabric"), Some("roce"));
    assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_bond_0"));
    // The seed: "For the pods I was running this was always port 9."
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), Some("9"));
    assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), Some("=net1"));
    assert_eq!(d.env_value("NCCL_SOCKET_NTHREADS"), Some("4"));
    assert_eq!(d.env_value("NCCL_NSOCKS_PERTHREAD"), Some("8"));
    assert_eq!(d.env_value("UCX_NET_DEVICES"), Some("mlx5_bond_0:1"));
    // This pod has no GPU: host-memory transports only.
    assert_eq!(d.env_value("UCX_TLS"), Some("rc,sm,self"));
    assert!(d.env.iter().all(|e| !e.reason.is_empty()));
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn bare_metal_and_docker_roce_get_the_same_selection() {
    let mut f = seed();
    f["host"]["container"] = json!({"runtime": null, "kubernetes": false, "launcher_env": {}});
    let d = detect(&f);
    assert_eq!(d.trait_value("orchestrator"), None);
    assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_bond_0"));
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), Some("9"));
    // Pod-network socket tuning is the orchestrator's note, not a RoCE rule.
    assert_eq!(d.env_value("NCCL_NSOCKS_PERTHREAD"), None);
    f["host"]["container"]["runtime"] = json!("docker");
    assert_eq!(detect(&f).env_value("NCCL_IB_GID_INDEX"), Some("9"));
}

#[test]
fn gid_index_follows_the_data_not_a_constant() {
    let mut f = seed();
    gids(&mut f).retain(|g| g["index"] != 9);
    gids(&mut f).push(
        json!({"index": 5, "gid": "0000:0000:0000:0000:0000:ffff:0a14:1e07",
        "gid_type": "RoCE v2", "ndev": "net1", "ipv4": null}),
    );
    assert_eq!(detect(&f).env_value("NCCL_IB_GID_INDEX"), Some("5"));
}

#[test]
fn a_gid_outside_this_namespace_or_off_the_pod_address_is_not_taken() {
    let mut f = seed();
    // A lower-index IPv4 RoCE v2 GID on the host's bond, which the pod cannot see.
    gids(&mut f).push(
        json!({"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0001",
        "gid_type": "RoCE v2", "ndev": "bond0", "ipv4": "10.0.0.1"}),
    );
    assert_eq!(detect(&f).env_value("NCCL_IB_GID_INDEX"), Some("9"));
    // Addresses known: a GID on net1 whose address net1 does not hold (10.20.30.7/24) is not
    // the pod's.
    let mut f = seed();
    gids(&mut f).push(
        json!({"index": 4, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0002",
        "gid_type": "RoCE v2", "ndev": "net1", "ipv4": "10.0.0.2"}),
    );
    assert_eq!(detect(&f).env_value("NCCL_IB_GID_INDEX"), Some("9"));
}

#[test]
fn says_so_when_the_owning_namespace_is_not_visible() {
    let mut f = seed();
    for g in gids(&mut f).iter_mut() {
        if g["ndev"] == "net1" {
            g["ndev"] = json!("net1-in-another-pod");
        }
    }
    let d = detect(&f);
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), None);
    assert_eq!(d.env_value("NCCL_IB_HCA"), None);
    assert!(
        warned(&d, "cannot see the network namespace"),
        "{:?}",
        d.warnings
    );
    assert!(warned(&d, "init container"), "{:?}", d.warnings);
}

#[test]
fn the_agents_own_pod_is_not_the_job_pod() {
    let mut f = seed();
    f["host"]["container"]["launcher_env"] = json!({"KUBERNETES_SERVICE_HOST": "10.96.0.1"});
    let d = detect(&f);
    assert_eq!(d.trait_value("orchestrator"), Some("kubernetes"));
    assert!(
        warned(&d, "computed in the agent's own pod"),
        "{:?}",
        d.warnings
    );
}

fn two_hcas(second_index: u64) -> Value {
    let mut f = seed();
    let mut second = f["rdma"]["devices"][0].clone();
    second["name"] = json!("mlx5_bond_1");
    second["netdevs"] = json!(["net2"]);
    second["ports"][0]["gids"] = json!([
        {"index": second_index, "gid": "0000:0000:0000:0000:0000:ffff:0a14:1f07",
         "gid_type": "RoCE v2", "ndev": "net2", "ipv4": "10.20.31.7"}]);
    f["rdma"]["devices"].as_array_mut().unwrap().push(second);
    f["network"]["interfaces"].as_array_mut().unwrap().push(
        json!({"name": "net2", "operstate": "up", "master": null, "slaves": [], "addresses": ["10.20.31.7/24"]}),
    );
    f
}

#[test]
fn two_hcas_that_agree_share_one_index() {
    let d = detect(&two_hcas(9));
    assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_bond_0,mlx5_bond_1"));
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), Some("9"));
    assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), Some("=net1,net2"));
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
}

#[test]
fn two_hcas_that_disagree_get_no_global_index() {
    let d = detect(&two_hcas(3));
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), None);
    assert_eq!(d.env_value("NCCL_IB_ADDR_FAMILY"), Some("AF_INET"));
    assert_eq!(d.env_value("NCCL_IB_ROCE_VERSION_NUM"), Some("2"));
    assert!(
        warned(&d, "mlx5_bond_0 uses 9, mlx5_bond_1 uses 3"),
        "{:?}",
        d.warnings
    );
    // An NCCL known to be too old for per-device selection gets no such variables.
    let mut f = two_hcas(3);
    f["software"]["nccl"] = json!("2.18.3");
    let d = detect(&f);
    assert_eq!(d.env_value("NCCL_IB_ADDR_FAMILY"), None);
    assert!(warned(&d, "older than 2.21"), "{:?}", d.warnings);
}

#[test]
fn warns_when_only_roce_v1_exists() {
    let mut f = seed();
    gids(&mut f).retain(|g| g["gid_type"] != "RoCE v2");
    let d = detect(&f);
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), None);
    assert!(warned(&d, "only RoCE v1"), "{:?}", d.warnings);
}

#[test]
fn a_dead_port_is_never_recommended_and_is_reported_with_its_state() {
    let mut f = seed();
    f["rdma"]["devices"][0]["ports"][0]["state"] = json!("DOWN");
    f["rdma"]["devices"][0]["ports"][0]["phys_state"] = json!("3: Disabled");
    let d = detect(&f);
    assert!(d.env.is_empty(), "{:?}", d.env);
    assert!(warned(
        &d,
        "mlx5_bond_0 port 1 is DOWN (physical state 3: Disabled)"
    ));
    // ACTIVE but not LinkUp is just as unusable.
    let mut f = two_hcas(9);
    f["rdma"]["devices"][1]["ports"][0]["phys_state"] = json!("4: PortConfigurationTraining");
    let d = detect(&f);
    assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_bond_0"));
    assert_eq!(d.env_value("UCX_NET_DEVICES"), Some("mlx5_bond_0:1"));
}

#[test]
fn infiniband_nodes_and_nodes_without_roce_are_left_alone() {
    let mut f = seed();
    f["rdma"]["devices"][0]["ports"][0]["link_layer"] = json!("InfiniBand");
    let d = detect(&f);
    assert!(d.env.is_empty() && d.warnings.is_empty(), "{d:?}");
    let mut f = seed();
    f["rdma"]["devices"] = json!([]);
    assert!(detect(&f).is_empty());
}

#[test]
fn versions_compare_by_major_and_minor() {
    assert_eq!(version("2.21.5"), Some((2, 21)));
    assert!(version("2.9.9").unwrap() < NCCL_PER_DEVICE_GID);
    assert_eq!(version("garbage"), None);
}

#[test]
fn disagreeing_hcas_with_a_foreign_gid_first_are_narrowed_not_guessed() {
    let mut f = two_hcas(7);
    // The host's bond1 holds an IPv4 RoCE v2 GID at 3, before the pod's net2 one at 7: NCCL's
    // own per-device choice would take 3, which belongs to another network namespace.
    f["rdma"]["devices"][1]["ports"][0]["gids"]
        .as_array_mut()
        .unwrap()
        .insert(
            0,
            json!({"index": 3, "gid": "0000:0000:0000:0000:0000:ffff:0a00:0101",
                   "gid_type": "RoCE v2", "ndev": "bond1", "ipv4": "10.0.1.1"}),
        );
    let d = detect(&f);
    assert_eq!(d.env_value("NCCL_IB_ADDR_FAMILY"), None);
    assert_eq!(d.env_value("NCCL_IB_HCA"), Some("=mlx5_bond_0"));
    assert_eq!(d.env_value("NCCL_IB_GID_INDEX"), Some("9"));
    assert_eq!(d.env_value("UCX_NET_DEVICES"), Some("mlx5_bond_0:1"));
    assert_eq!(d.env_value("NCCL_SOCKET_IFNAME"), Some("=net1"));
    assert!(warned(&d, "mlx5_bond_1 left out"), "{:?}", d.warnings);
}
