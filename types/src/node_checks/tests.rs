use serde_json::{Value, json};

use super::*;

fn facts(extra: Value) -> NodeFacts {
    let mut base = json!({
        "schema_version": 1,
        "collected_at": "2026-11-24T00:00:00Z",
        "live": false,
        "host": {"hostname": "n1", "kernel": "5.15.0-91-generic", "os": {}, "dmi": {}, "container": {"kubernetes": false}},
        "cpu": {},
        "nvml": {"state": "not_consulted", "message": "fixture"},
        "gpus": [{"index": 0, "bdf": "0000:07:00.0", "device_id": "0x2330", "name": null, "name_source": null,
                  "uuid": null, "memory_total_bytes": null, "numa_node": 0, "cpu_affinity": null}],
        "rdma": {"sysfs": {"state": "available", "message": ""}, "verbs": {"state": "not_consulted", "message": ""},
                 "devices": []},
        "network": {},
        "software": {},
        "topology": {"nvlink_source": "fixture"},
    });
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(base).expect("facts decode")
}

fn gpu(extra: Value) -> Value {
    let mut g = json!({"index": 0, "bdf": "0000:07:00.0"});
    for (k, v) in extra.as_object().unwrap() {
        g[k] = v.clone();
    }
    g
}

fn find<'a>(checks: &'a [NodeCheck], name: &str) -> Vec<&'a NodeCheck> {
    checks.iter().filter(|c| c.name == name).collect()
}

#[test]
fn old_agents_facts_parse_and_say_unknown() {
    let f = facts(json!({}));
    assert!(f.conditions.is_none());
    let checks = evaluate(&f, None);
    for name in ["gpu-pcie-link", "gpu-ecc", "gpu-xid", "gpu-persistence"] {
        let c = find(&checks, name);
        assert_eq!(c.len(), 1, "{name}: {checks:?}");
        assert_eq!(c[0].state, Verdict::Unknown);
        assert!(c[0].to_reason().is_none());
    }
}

#[test]
fn narrow_pcie_link_warns_and_full_link_passes() {
    let narrow =
        gpu(json!({"pcie": {"current_gen": 3, "max_gen": 4, "current_width": 8, "max_width": 16}}));
    let full = json!({"index": 1, "bdf": "0000:08:00.0",
        "pcie": {"current_gen": 4, "max_gen": 4, "current_width": 16, "max_width": 16}});
    let f = facts(json!({"conditions": {"gpus": [narrow, full]}}));
    let c = find(&evaluate(&f, None), "gpu-pcie-link")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(c[0].state, Verdict::Warn);
    assert!(
        c[0].reason.contains("Gen3 x8, below its maximum Gen4 x16"),
        "{}",
        c[0].reason
    );
    assert_eq!(c[1].state, Verdict::Pass);
    // A lower generation at full width is power saving while idle, a fault while busy.
    let idle = gpu(
        json!({"pcie": {"current_gen": 1, "max_gen": 4, "current_width": 16, "max_width": 16}}),
    );
    let busy = gpu(
        json!({"pcie": {"current_gen": 3, "max_gen": 4, "current_width": 16, "max_width": 16},
        "persistence_mode": true, "processes": [{"pid": 7, "name": "python", "used_memory_bytes": null}]}),
    );
    let state = |g: Value| {
        find(
            &evaluate(&facts(json!({"conditions": {"gpus": [g]}})), None),
            "gpu-pcie-link",
        )[0]
        .state
    };
    assert_eq!(state(idle), Verdict::Pass);
    assert_eq!(state(busy), Verdict::Warn);
    let r = c[0].to_reason().unwrap();
    assert_eq!(r.code.as_deref(), Some("gpu-pcie-link"));
    assert_eq!(r.basis, BASIS);
    assert!(r.message.starts_with("GPU0 0000:07:00.0: "));
}

#[test]
fn nvml_conditions_are_judged() {
    let g = gpu(json!({
        "power_limit_w": 300.0, "default_power_limit_w": 400.0,
        "throttle_reasons": ["sw_power_cap", "hw_slowdown"],
        "persistence_mode": false,
        "ecc": {"enabled": true, "volatile_uncorrected": 2, "aggregate_uncorrected": 2},
        "processes": [{"pid": 4242, "name": "python", "used_memory_bytes": 1024}]
    }));
    let checks = evaluate(&facts(json!({"conditions": {"gpus": [g]}})), None);
    let state = |n: &str| find(&checks, n)[0].state;
    assert_eq!(state("gpu-power-cap"), Verdict::Warn);
    assert_eq!(state("gpu-throttle"), Verdict::Warn);
    assert_eq!(state("gpu-persistence"), Verdict::Warn);
    assert_eq!(state("gpu-ecc"), Verdict::Fail);
    assert_eq!(state("gpu-processes"), Verdict::Warn);
    assert!(
        find(&checks, "gpu-processes")[0]
            .reason
            .contains("python (pid 4242)")
    );
    assert!(
        find(&checks, "gpu-throttle")[0]
            .reason
            .contains("hw_slowdown")
    );

    let ok = gpu(json!({
        "power_limit_w": 400.0, "default_power_limit_w": 400.0, "throttle_reasons": ["sw_power_cap"],
        "persistence_mode": true, "ecc": {"enabled": true, "volatile_corrected": 3, "volatile_uncorrected": 0}
    }));
    let checks = evaluate(&facts(json!({"conditions": {"gpus": [ok]}})), None);
    for n in [
        "gpu-power-cap",
        "gpu-throttle",
        "gpu-persistence",
        "gpu-ecc",
        "gpu-processes",
    ] {
        assert_eq!(find(&checks, n)[0].state, Verdict::Pass, "{n}: {checks:?}");
    }
}

#[test]
fn pending_remap_warns_and_failed_remap_fails() {
    let pending = gpu(json!({"persistence_mode": true, "ecc": {"remap_pending": true}}));
    let failed = gpu(
        json!({"persistence_mode": true, "ecc": {"remap_failed": true, "remap_pending": true}}),
    );
    let one = |g: Value| {
        find(
            &evaluate(&facts(json!({"conditions": {"gpus": [g]}})), None),
            "gpu-ecc",
        )[0]
        .state
    };
    assert_eq!(one(pending), Verdict::Warn);
    assert_eq!(one(failed), Verdict::Fail);
}

fn xid(seq: u64, xid: u32) -> Value {
    json!({"seq": seq, "pci": "0000:07:00", "xid": xid, "text": format!("{xid}, pid=1")})
}

#[test]
fn xid_events_count_only_since_the_last_report() {
    let before =
        facts(json!({"conditions": {"xid_source": "/dev/kmsg", "xid_events": [xid(10, 13)]}}));
    let same =
        facts(json!({"conditions": {"xid_source": "/dev/kmsg", "xid_events": [xid(10, 13)]}}));
    let c = evaluate(&same, Some(&before));
    assert_eq!(find(&c, "gpu-xid")[0].state, Verdict::Pass, "{c:?}");

    let later = facts(
        json!({"conditions": {"xid_source": "/dev/kmsg", "xid_events": [xid(10, 13), xid(20, 79)]}}),
    );
    let c = evaluate(&later, Some(&before));
    let x = find(&c, "gpu-xid");
    assert_eq!(x.len(), 1);
    assert_eq!(x[0].state, Verdict::Fail);
    assert_eq!(x[0].subject.as_deref(), Some("GPU0 0000:07:00.0"));
    assert!(
        x[0].reason.starts_with("Xid 79 since the last report"),
        "{}",
        x[0].reason
    );

    // First report: everything in the log counts; Xid 13 only warns.
    let c = evaluate(&before, None);
    assert_eq!(find(&c, "gpu-xid")[0].state, Verdict::Warn);

    // A reboot restarts the sequence: the new boot's events are all new.
    let rebooted =
        facts(json!({"conditions": {"xid_source": "/dev/kmsg", "xid_events": [xid(3, 48)]}}));
    assert_eq!(
        find(&evaluate(&rebooted, Some(&later)), "gpu-xid")[0].state,
        Verdict::Fail
    );
}

fn counters(sym: u64, downed: u64) -> Value {
    json!({"xid_source": "x", "ib_counters": [{"device": "mlx5_0", "port": 1, "symbol_error": sym,
        "link_downed": downed, "port_rcv_errors": 0, "link_error_recovery": 0}]})
}

#[test]
fn port_counters_are_deltas_between_reports() {
    let a = facts(json!({"conditions": counters(5, 1)}));
    let b = facts(json!({"conditions": counters(5, 1)}));
    let c = facts(json!({"conditions": counters(9, 1)}));
    let first = evaluate(&a, None);
    assert_eq!(find(&first, "ib-port-errors")[0].state, Verdict::Warn);
    assert!(
        find(&first, "ib-port-errors")[0]
            .reason
            .contains("symbol_error +5, link_downed +1 since the counters were last cleared")
    );
    assert_eq!(
        find(&evaluate(&b, Some(&a)), "ib-port-errors")[0].state,
        Verdict::Pass
    );
    let grew = evaluate(&c, Some(&b));
    let g = find(&grew, "ib-port-errors")[0];
    assert_eq!(g.state, Verdict::Warn);
    assert!(
        g.reason
            .starts_with("symbol_error +4 since the last report"),
        "{}",
        g.reason
    );
    assert_eq!(g.subject.as_deref(), Some("mlx5_0:1"));
    // Cleared counters count from zero again rather than going negative.
    assert_eq!(
        find(&evaluate(&b, Some(&c)), "ib-port-errors")[0].state,
        Verdict::Warn
    );
}

fn port(name: &str, netdev: &str, state: &str, phys: &str) -> Value {
    json!({"name": name, "netdevs": [netdev], "ports": [{"port": 1, "state": state,
        "phys_state": phys, "link_layer": "InfiniBand"}]})
}

#[test]
fn phys_state_and_mtu_across_ports() {
    let f = facts(json!({
        "rdma": {"sysfs": {"state": "available", "message": ""}, "verbs": {"state": "not_consulted", "message": ""},
            "devices": [port("mlx5_0", "ib0", "ACTIVE", "5: LinkUp"), port("mlx5_1", "ib1", "ACTIVE", "5: LinkUp"),
                        port("mlx5_2", "ib2", "DOWN", "2: Polling")]},
        "network": {"interfaces": [
            {"name": "ib0", "kind": "infiniband", "mtu": 2044, "virtual_device": false},
            {"name": "ib1", "kind": "infiniband", "mtu": 65520, "virtual_device": false},
            {"name": "ib2", "kind": "infiniband", "mtu": 1500, "virtual_device": false}]}
    }));
    let c = evaluate(&f, None);
    let phys = find(&c, "ib-phys-state");
    assert_eq!(phys.len(), 3);
    assert_eq!(phys[2].state, Verdict::Warn);
    assert!(
        phys[2]
            .reason
            .contains("2: Polling, not LinkUp: no link partner")
    );
    let mtu = find(&c, "port-mtu");
    assert_eq!(mtu.len(), 1, "only ACTIVE ports count: {mtu:?}");
    assert_eq!(mtu[0].state, Verdict::Warn);
    assert!(
        mtu[0]
            .reason
            .contains("ib0 (mlx5_0) 2044, ib1 (mlx5_1) 65520"),
        "{}",
        mtu[0].reason
    );
}

#[test]
fn bonds_and_nccl_conf() {
    let f = facts(json!({"conditions": {
        "bonds": [
            {"name": "bond0", "members": [{"name": "eth0", "mii_status": "up"}, {"name": "eth1", "mii_status": "down"}]},
            {"name": "bond1", "members": [{"name": "eth2", "mii_status": "down"}]},
            {"name": "bond2", "members": [{"name": "eth3", "mii_status": "up"}]}],
        "nccl_conf": [{"path": "/etc/nccl.conf", "variables": {"NCCL_IB_DISABLE": "1"}}]
    }}));
    let c = evaluate(&f, None);
    let b = find(&c, "bond-members");
    assert_eq!(
        b.iter().map(|c| c.state).collect::<Vec<_>>(),
        [Verdict::Warn, Verdict::Fail, Verdict::Pass]
    );
    assert!(b[0].reason.starts_with("member(s) eth1 down of 2"));
    let n = find(&c, "nccl-conf");
    assert_eq!(n[0].state, Verdict::Warn);
    assert!(n[0].reason.contains("NCCL_IB_DISABLE=1"));
    assert_eq!(n[0].subject.as_deref(), Some("/etc/nccl.conf"));
}

#[test]
fn container_rdma_core_against_the_host_stack() {
    let dev = json!([port("mlx5_0", "net1", "ACTIVE", "5: LinkUp")]);
    let node = |kernel: &str, installed: &str, ofed: Value| {
        facts(json!({
            "host": {"hostname": "p", "kernel": kernel, "os": {}, "dmi": {},
                     "container": {"runtime": "kubernetes", "kubernetes": true}},
            "rdma": {"sysfs": {"state": "available", "message": ""}, "verbs": {"state": "not_consulted", "message": ""}, "devices": dev},
            "software": {"ofed": ofed},
            "conditions": {"rdma_core_installed": installed}
        }))
    };
    let state = |f: &NodeFacts| find(&evaluate(f, None), "rdma-core")[0].state;
    assert_eq!(
        state(&node("5.15.0-91-generic", "28.0", json!(null))),
        Verdict::Warn
    );
    assert_eq!(
        state(&node("5.15.0-91-generic", "39.0", json!(null))),
        Verdict::Pass
    );
    assert_eq!(
        state(&node(
            "5.15.0",
            "56mlnx40",
            json!("MLNX_OFED_LINUX-5.8-1.0.1.1")
        )),
        Verdict::Warn
    );
    assert_eq!(
        state(&node("5.15.0", "2310mlnx47", json!("23.10-1.1.9"))),
        Verdict::Pass
    );
    assert!(
        find(
            &evaluate(&node("5.15.0", "28.0", json!(null)), None),
            "rdma-core"
        )[0]
        .reason
        .contains("rdma-core 28.0 is older than the host's kernel 5.15.0")
    );
    // Bare metal: the host's own user space, nothing to compare.
    let mut bare = node("5.15.0", "28.0", json!(null));
    bare.host.container.runtime = None;
    assert!(find(&evaluate(&bare, None), "rdma-core").is_empty());
}

#[test]
fn ipoib_subnets_across_a_site() {
    let with = |addr: &str| {
        facts(json!({"network": {"interfaces": [
            {"name": "ib0", "kind": "infiniband", "virtual_device": false, "addresses": [addr, "fe80::1/64"]}]}}))
    };
    let (a, b, c) = (
        with("10.1.0.1/16"),
        with("10.1.7.2/16"),
        with("10.2.0.3/24"),
    );
    let site = vec![
        ("a".to_string(), &a),
        ("b".to_string(), &b),
        ("c".to_string(), &c),
    ];
    let odd = ipoib_subnets("c", &site);
    assert_eq!(odd.len(), 1);
    assert_eq!(odd[0].state, Verdict::Warn);
    assert!(
        odd[0]
            .reason
            .contains("ib0 is on 10.2.0.0/24 but 2 of the site's 3 nodes use 10.1.0.0/16"),
        "{}",
        odd[0].reason
    );
    let fine = ipoib_subnets("a", &site[..2]);
    assert_eq!(fine[0].state, Verdict::Pass);
    assert!(ipoib_subnets("nobody", &site).is_empty());
}
