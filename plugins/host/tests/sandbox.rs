//! The host against real components: the first-party plugins on the seed fixtures, and every
//! kind of hostile plugin. Components come from `plugins/dist/` (scripts/build-plugins.sh) or
//! are written inline as WAT; nothing here needs the network.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{dist, fixture, hostile};
use heddle_plugin_host::{FactsJson, HostConfig, HostError, Limits, PluginHost};

/// One host for the whole test binary, as in production: each component compiles once and
/// every test also checks that earlier tests' hostile plugins left the host usable.
fn host() -> &'static PluginHost {
    static HOST: OnceLock<PluginHost> = OnceLock::new();
    HOST.get_or_init(|| PluginHost::new(HostConfig::default()).expect("host"))
}

#[test]
fn fixtures_match_the_agents_facts_schema() {
    for name in ["azure-nd40rs-v2.json", "runai-roce.json", "dgx1.json"] {
        let parsed: Result<heddle_types::facts::NodeFacts, _> =
            serde_json::from_str(&fixture(name));
        assert!(parsed.is_ok(), "{name}: {:?}", parsed.err());
    }
}

#[test]
fn azure_nd_on_seed_001() {
    let r = host()
        .run(
            &dist("azure-nd"),
            &fixture("azure-nd40rs-v2.json"),
            &Limits::default(),
        )
        .unwrap();
    assert_eq!(r.plugin.name, "azure-nd");
    let d = &r.detection;
    assert!(
        d.traits.contains(&("azure.sku".into(), "ND40rs_v2".into())),
        "{:?}",
        d.traits
    );
    // The InfiniBand HCA list is dgx-affinity's; azure-nd sets the bootstrap interface.
    let ifname = d
        .env
        .iter()
        .find(|e| e.name == "NCCL_SOCKET_IFNAME")
        .unwrap();
    assert_eq!(ifname.value, "=eth0");
    assert!(d.warnings.iter().any(|w| w.contains("rdmaP36305p0s2")));
    assert!(r.usage.fuel_consumed > 0 && r.usage.peak_memory_bytes > 0);
}

#[test]
fn runai_roce_on_seed_003() {
    let r = host()
        .run(
            &dist("runai-roce"),
            &fixture("runai-roce.json"),
            &Limits::default(),
        )
        .unwrap();
    let env: Vec<(&str, &str)> = r
        .detection
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_str()))
        .collect();
    assert!(env.contains(&("NCCL_IB_GID_INDEX", "9")), "{env:?}");
    assert!(env.contains(&("NCCL_IB_HCA", "=mlx5_bond_0")));
    assert!(env.contains(&("NCCL_SOCKET_NTHREADS", "4")));
}

#[test]
fn dgx_affinity_on_seed_004() {
    let r = host()
        .run(
            &dist("dgx-affinity"),
            &fixture("dgx1.json"),
            &Limits::default(),
        )
        .unwrap();
    let a = &r.detection.affinity;
    assert_eq!(a.len(), 8);
    assert_eq!(
        (a[2].nic.as_deref(), a[2].netdev.as_deref()),
        (Some("mlx5_1"), Some("ib1"))
    );
    assert_eq!((a[5].cpus.as_str(), a[5].numa), ("20-39,60-79", Some(1)));
}

#[test]
fn first_party_plugins_ignore_nodes_they_do_not_know() {
    let h = host();
    for name in ["azure-nd", "runai-roce", "dgx-affinity", "template"] {
        let r = h
            .run(&dist(name), r#"{"schema_version": 1}"#, &Limits::default())
            .unwrap();
        assert!(r.detection.is_empty(), "{name}: {:?}", r.detection);
    }
}

#[test]
fn validate_reports_info_imports_and_caches() {
    let h = PluginHost::new(HostConfig::default()).unwrap();
    let bytes = dist("template");
    let info = h.validate(&bytes, &Limits::default()).unwrap();
    assert_eq!(info.plugin.name, "my-plugin");
    assert_eq!(info.contract, "heddle:plugin@0.2.0");
    assert_eq!(info.sha256.len(), 64);
    assert!(!info.compile_time.cache_hit && info.compile_time.micros > 0);
    assert!(
        info.imports
            .iter()
            .any(|i| i.starts_with("heddle:plugin/log@")),
        "{:?}",
        info.imports
    );
    assert!(info.imports.iter().all(|i| !i.starts_with("wasi:sockets")));
    let again = h.validate(&bytes, &Limits::default()).unwrap();
    assert!(again.compile_time.cache_hit);
    let r = h
        .run(&bytes, &fixture("dgx1.json"), &Limits::default())
        .unwrap();
    assert!(r.usage.cache_hit);
    assert_eq!(h.cached(), 1);
}

#[test]
fn endless_loop_runs_out_of_fuel() {
    let limits = Limits {
        fuel: 20_000_000,
        ..Limits::default()
    };
    let err = host()
        .run(&dist("misbehave"), &hostile("loop"), &limits)
        .unwrap_err();
    let HostError::FuelExhausted { limit, usage } = &err else {
        panic!("{err}")
    };
    assert_eq!(*limit, 20_000_000);
    assert_eq!(usage.fuel_consumed, 20_000_000);
    assert!(err.to_string().contains("endless loop"));
}

#[test]
fn wall_clock_deadline_stops_a_loop_that_fuel_would_not() {
    let limits = Limits {
        fuel: u64::MAX / 2,
        timeout: Duration::from_millis(100),
        ..Limits::default()
    };
    let err = host()
        .run(&dist("misbehave"), &hostile("loop"), &limits)
        .unwrap_err();
    let HostError::Timeout {
        limit_ms: 100,
        usage,
    } = &err
    else {
        panic!("{err}")
    };
    assert!(
        usage.elapsed >= Duration::from_millis(100),
        "{:?}",
        usage.elapsed
    );
    assert!(
        usage.elapsed < Duration::from_secs(2),
        "{:?}",
        usage.elapsed
    );
}

#[test]
fn memory_bomb_hits_the_cap() {
    let limits = Limits {
        max_memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let err = host()
        .run(&dist("misbehave"), &hostile("memory"), &limits)
        .unwrap_err();
    let HostError::MemoryLimit {
        requested,
        limit,
        usage,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(*limit, 16 << 20);
    assert!(*requested > 16 << 20);
    assert!(usage.peak_memory_bytes <= 16 << 20);
}

#[test]
fn huge_output_is_refused() {
    let err = host()
        .run(&dist("misbehave"), &hostile("output"), &Limits::default())
        .unwrap_err();
    let HostError::OutputTooLarge { size, limit, .. } = &err else {
        panic!("{err}")
    };
    assert!(*size >= 8 << 20 && *limit == 1 << 20, "{size} {limit}");
}

#[test]
fn panic_is_a_trap_with_the_panic_message() {
    let err = host()
        .run(&dist("misbehave"), &hostile("panic"), &Limits::default())
        .unwrap_err();
    let HostError::Trap { stderr, .. } = &err else {
        panic!("{err}")
    };
    assert!(stderr.contains("misbehave was asked to panic"), "{stderr}");
    assert!(
        err.to_string().contains("misbehave was asked to panic"),
        "{err}"
    );
}

#[test]
fn runaway_recursion_is_a_trap_not_a_host_stack_overflow() {
    let err = host()
        .run(&dist("misbehave"), &hostile("recurse"), &Limits::default())
        .unwrap_err();
    assert_eq!(err.code(), "trap", "{err}");
    assert!(err.to_string().contains("stack"), "{err}");
}

#[test]
fn abort_is_a_trap() {
    let err = host()
        .run(&dist("misbehave"), &hostile("trap"), &Limits::default())
        .unwrap_err();
    assert_eq!(err.code(), "trap", "{err}");
    assert!(err.to_string().contains("unreachable"), "{err}");
}

#[test]
fn plugin_errors_are_reported_as_such() {
    let err = host()
        .run(&dist("misbehave"), &hostile("error"), &Limits::default())
        .unwrap_err();
    let HostError::Plugin { code, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(code, "unsupported");
    assert!(err.usage().is_some());
}

#[test]
fn log_and_stdout_floods_are_capped_not_fatal() {
    let h = host();
    // This is about capping, not speed: 16 MiB of writes through an unoptimised test build of
    // the host on a busy machine can take longer than the default deadline.
    let limits = Limits {
        timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let r = h
        .run(&dist("misbehave"), &hostile("log-flood"), &limits)
        .unwrap();
    assert!(r.usage.logs_dropped > 0);
    assert!(r.logs.iter().map(|l| l.message.len()).sum::<usize>() <= limits.max_log_bytes);
    let r = h
        .run(&dist("misbehave"), &hostile("stdout-flood"), &limits)
        .unwrap();
    assert_eq!(r.stdout.len(), limits.max_stdio_bytes);
    assert_eq!(r.usage.stdout_dropped_bytes, (16 << 20) - (64 << 10));
}

#[test]
fn sockets_are_linked_but_every_call_is_refused() {
    // Its component imports `wasi:sockets` (as CPython's does); it runs, and its name lookup
    // and connection both fail, so all it can report is an error.
    let h = host();
    let info = h.validate(&dist("netclient"), &Limits::default()).unwrap();
    assert!(
        info.imports
            .iter()
            .any(|i| i.starts_with("wasi:sockets/tcp")),
        "{:?}",
        info.imports
    );
    let err = h
        .run(&dist("netclient"), "{}", &Limits::default())
        .unwrap_err();
    let HostError::Plugin { code, message, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(code, "network", "the name lookup must fail too: {message}");
    assert!(
        message.to_lowercase().contains("denied"),
        "connect must be refused as access denied: {message}"
    );
}

#[test]
fn http_import_is_refused_by_name() {
    let bytes =
        wat::parse_str(r#"(component (import "wasi:http/outgoing-handler@0.2.0" (instance)))"#)
            .unwrap();
    let err = host().validate(&bytes, &Limits::default()).unwrap_err();
    let HostError::DisallowedImport { import } = &err else {
        panic!("{err}")
    };
    assert_eq!(import, "wasi:http/outgoing-handler@0.2.0");
    assert!(err.to_string().contains(import.as_str()));
}

#[test]
fn files_are_out_of_reach() {
    let err = host()
        .run(&dist("misbehave"), &hostile("file"), &Limits::default())
        .unwrap_err();
    let HostError::Plugin { code, message, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(code, "file", "{message}");
}

#[test]
fn foreign_import_is_refused_by_name() {
    let bytes =
        wat::parse_str(r#"(component (import "evil:net/exfil@0.1.0" (instance)))"#).unwrap();
    let err = host().validate(&bytes, &Limits::default()).unwrap_err();
    assert!(
        matches!(&err, HostError::DisallowedImport { import } if import == "evil:net/exfil@0.1.0"),
        "{err}"
    );
}

#[test]
fn component_of_another_world_is_refused() {
    let bytes = wat::parse_str(
        r#"(component
             (core module $m (func (export "f") (result i32) i32.const 42))
             (core instance $i (instantiate $m))
             (func (export "hello") (result u32) (canon lift (core func $i "f"))))"#,
    )
    .unwrap();
    let err = host().validate(&bytes, &Limits::default()).unwrap_err();
    let HostError::WrongWorld { found, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(found, "hello");
}

#[test]
fn non_components_are_refused_with_a_reason() {
    let h = host();
    let core = wat::parse_str("(module)").unwrap();
    let err = h.validate(&core, &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("core WebAssembly module"), "{err}");
    for bytes in [
        &b""[..],
        b"#!/bin/sh\necho hi\n",
        b"\0asm\x0d\x00\x01\x00garbage",
    ] {
        let err = h.validate(bytes, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "not-a-component", "{err}");
    }
    let big = vec![0u8; Limits::default().max_component_bytes + 1];
    assert_eq!(
        h.validate(&big, &Limits::default()).unwrap_err().code(),
        "too-large"
    );
}

#[test]
fn bad_facts_are_the_callers_fault() {
    let err = host()
        .run(&dist("template"), "{not json", &Limits::default())
        .unwrap_err();
    assert_eq!(err.code(), "bad-facts");
    assert!(!err.is_plugin_fault());
}

#[test]
fn host_keeps_serving_after_every_hostile_case() {
    let h = PluginHost::new(HostConfig::default()).unwrap();
    let limits = Limits {
        fuel: 20_000_000,
        max_memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let bad = dist("misbehave");
    for mode in ["loop", "memory", "output", "panic", "trap", "recurse"] {
        assert!(h.run(&bad, &hostile(mode), &limits).is_err(), "{mode}");
    }
    assert_eq!(
        h.run(&dist("netclient"), "{}", &limits).unwrap_err().code(),
        "plugin-error"
    );
    let sleepy = Limits {
        timeout: Duration::from_millis(200),
        ..limits
    };
    assert_eq!(
        h.run(&bad, &hostile("sleep"), &sleepy).unwrap_err().code(),
        "timeout"
    );
    let r = h.run(&bad, &hostile("ok"), &limits).unwrap();
    assert_eq!(
        r.detection.traits,
        vec![("misbehave.host".to_string(), "n1".to_string())]
    );
    assert_eq!(r.logs.len(), 1);
    let r = h
        .run(&dist("dgx-affinity"), &fixture("dgx1.json"), &limits)
        .unwrap();
    assert_eq!(r.detection.affinity.len(), 8);
}

#[test]
fn pooling_allocator_runs_plugins_too() {
    let h = PluginHost::new(HostConfig {
        pooling_instances: Some(4),
        ..HostConfig::default()
    })
    .unwrap();
    let r = h
        .run(
            &dist("runai-roce"),
            &fixture("runai-roce.json"),
            &Limits::default(),
        )
        .unwrap();
    assert!(!r.detection.env.is_empty());
    let err = h
        .run(
            &dist("misbehave"),
            &hostile("memory"),
            &Limits {
                max_memory_bytes: 8 << 20,
                ..Limits::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.code(), "memory-limit", "{err}");
}

#[test]
fn one_shot_helper_matches_the_host() {
    let r = heddle_plugin_host::run_on_facts_json(
        &dist("azure-nd"),
        &fixture("azure-nd40rs-v2.json"),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(r.plugin.name, "azure-nd");
}

#[test]
fn load_then_call_skips_recompiling() {
    let h = host();
    let plugin = h.load(&dist("runai-roce"), &Limits::default()).unwrap();
    assert_eq!(plugin.info().name, "runai-roce");
    assert_eq!(plugin.sha256().len(), 64);
    let facts = FactsJson::parse(&fixture("runai-roce.json")).unwrap();
    let a = h.call(&plugin, &facts, &Limits::default()).unwrap();
    let b = h
        .run(
            &dist("runai-roce"),
            &fixture("runai-roce.json"),
            &Limits::default(),
        )
        .unwrap();
    assert!(b.usage.cache_hit);
    assert_eq!(a.detection, b.detection);
    assert_eq!(FactsJson::parse("[").err().unwrap().code(), "bad-facts");
    assert_eq!(
        h.run(&dist("runai-roce"), "{", &Limits::default())
            .unwrap_err()
            .code(),
        "bad-facts"
    );
}

#[test]
fn a_plugin_built_against_contract_0_1_runs_beside_0_2_ones() {
    let h = host();
    let v01 = h
        .validate(&dist("contract-v01"), &Limits::default())
        .unwrap();
    assert_eq!(v01.contract, "heddle:plugin@0.1.0");
    assert!(
        v01.imports.contains(&"heddle:plugin/log@0.1.0".to_string()),
        "{:?}",
        v01.imports
    );
    assert!(v01.plugin.reads.is_empty());
    let r = h
        .run(
            &dist("contract-v01"),
            &fixture("dgx1.json"),
            &Limits::default(),
        )
        .unwrap();
    assert_eq!(
        r.detection.traits,
        [
            (
                "v01.gpu_model".to_string(),
                "Tesla V100-SXM2-32GB".to_string()
            ),
            ("v01.hostname".to_string(), "dgx15".to_string()),
        ],
        "a 0.1 plugin sees the whole document"
    );
    assert_eq!(r.detection.env[0].name, "NCCL_DEBUG");
    assert!(r.detection.expectations.is_empty());
    assert_eq!(r.logs[0].message, "0.1 detector called");
    let v02 = h.validate(&dist("misbehave"), &Limits::default()).unwrap();
    assert_eq!(v02.contract, "heddle:plugin@0.2.0");
    assert!(
        v02.imports.contains(&"heddle:plugin/log@0.2.0".to_string()),
        "{:?}",
        v02.imports
    );
}

#[test]
fn a_0_2_plugin_sees_only_the_facts_it_declared() {
    let h = host();
    let info = h.validate(&dist("misbehave"), &Limits::default()).unwrap();
    assert_eq!(info.plugin.reads, ["/hostile", "/seed", "/host/hostname"]);
    let facts = r#"{"hostile": "echo", "host": {"hostname": "n1", "serial": "S3CR3T"}, "rdma": {"devices": []}}"#;
    let r = h
        .run(&dist("misbehave"), facts, &Limits::default())
        .unwrap();
    let seen: serde_json::Value = serde_json::from_str(&r.detection.traits[0].1).unwrap();
    assert_eq!(
        seen,
        serde_json::json!({"hostile": "echo", "host": {"hostname": "n1"}})
    );
}

#[test]
fn the_small_guest_stack_parses_the_deepest_json_serde_accepts() {
    // serde_json refuses nesting past 128 levels; everything below must parse inside a guest
    // built with the workspace's 64 KiB shadow stack (plugins/.cargo/config.toml).
    let deep = format!("{}1{}", "[".repeat(126), "]".repeat(126));
    let facts = format!(r#"{{"gpus": [{{"name": "H100"}}], "deep": {deep}}}"#);
    let r = host()
        .run(&dist("contract-v01"), &facts, &Limits::default())
        .unwrap();
    assert_eq!(
        r.detection.traits[0],
        ("v01.gpu_model".to_string(), "H100".to_string())
    );
    // Deeper than that never reaches a plugin: the host's own check refuses it.
    let too_deep = format!(r#"{{"deep": {}1{}}}"#, "[".repeat(200), "]".repeat(200));
    let err = host()
        .run(&dist("contract-v01"), &too_deep, &Limits::default())
        .unwrap_err();
    assert_eq!(err.code(), "bad-facts", "{err}");
}
