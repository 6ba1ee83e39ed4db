//! What no limit inside WebAssembly reaches: waits in host code, a full instance pool,
//! compilation; and the compile cache on disk.

mod common;

use std::time::Duration;

use common::{dist, fixture, hostile, within};
use heddle_plugin_host::{HostConfig, HostError, Limits, PluginHost};

#[test]
fn sleeping_plugin_is_stopped_at_its_time_limit() {
    // `std::thread::sleep(1 h)` is a WASI clock wait in host code, where fuel and the epoch
    // deadline do not reach.
    let limits = Limits {
        timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let err = within(Duration::from_secs(30), move || {
        PluginHost::new(HostConfig::default())
            .unwrap()
            .run(&dist("misbehave"), &hostile("sleep"), &limits)
            .unwrap_err()
    });
    let HostError::Timeout { limit_ms, usage } = &err else {
        panic!("{err}")
    };
    assert_eq!(*limit_ms, 300);
    assert!(
        usage.elapsed < Duration::from_secs(2),
        "{:?}",
        usage.elapsed
    );
    assert!(err.to_string().contains("300 ms"), "{err}");
    // A wait that ends before the deadline is a plain sleep.
    let r = PluginHost::new(HostConfig::default())
        .unwrap()
        .run(&dist("misbehave"), &hostile("nap"), &limits)
        .unwrap();
    assert_eq!(r.detection.traits[0].1, "20ms");
    assert!(r.usage.elapsed >= Duration::from_millis(20));
}

#[test]
fn a_full_instance_pool_is_the_hosts_failure_not_the_plugins() {
    let h = std::sync::Arc::new(
        PluginHost::new(HostConfig {
            pooling_instances: Some(1),
            ..HostConfig::default()
        })
        .unwrap(),
    );
    let limits = Limits {
        timeout: Duration::from_secs(20),
        ..Limits::default()
    };
    let bytes = dist("misbehave");
    h.validate(&bytes, &limits).unwrap();
    // One call holds the only slot for a second...
    let sleeper = {
        let (h, bytes) = (h.clone(), bytes.clone());
        let facts = r#"{"hostile": "sleep", "seed": 1}"#;
        std::thread::spawn(move || h.run(&bytes, facts, &limits))
    };
    std::thread::sleep(Duration::from_millis(300));
    // ...so this one finds the pool full: no verdict on the plugin.
    let err = h.run(&bytes, &hostile("ok"), &limits).unwrap_err();
    assert_eq!(err.code(), "unavailable", "{err}");
    assert!(err.is_host_side() && !err.is_plugin_fault(), "{err}");
    let slept = sleeper.join().unwrap().unwrap();
    assert_eq!(slept.detection.traits[0].1, "1");
    assert!(h.run(&bytes, &hostile("ok"), &limits).is_ok());
}

#[test]
fn compiled_components_are_cached_on_local_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("compiled");
    let config = || HostConfig {
        cache_dir: Some(cache.clone()),
        ..HostConfig::default()
    };
    let bytes = dist("runai-roce");
    let first = PluginHost::new(config())
        .unwrap()
        .validate(&bytes, &Limits::default())
        .unwrap();
    assert!(!first.compile_time.cache_hit);
    let entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let name = entries[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with(&first.sha256), "{name}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700);
    assert_eq!(mode(&entries[0]) & 0o077, 0);

    // A new process (host) loads it instead of compiling, and it runs the same.
    let second = PluginHost::new(config()).unwrap();
    assert!(
        second
            .validate(&bytes, &Limits::default())
            .unwrap()
            .compile_time
            .cache_hit
    );
    let r = second
        .run(&bytes, &fixture("runai-roce.json"), &Limits::default())
        .unwrap();
    assert!(
        r.detection
            .env
            .iter()
            .any(|e| e.name == "NCCL_IB_GID_INDEX")
    );

    // A damaged entry is thrown away and the component compiled again.
    std::fs::write(&entries[0], b"not a compiled component").unwrap();
    let third = PluginHost::new(config()).unwrap();
    assert!(
        !third
            .validate(&bytes, &Limits::default())
            .unwrap()
            .compile_time
            .cache_hit
    );
    // A directory others may write to is not trusted at all: the host compiles.
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let fourth = PluginHost::new(config()).unwrap();
    assert!(
        !fourth
            .validate(&bytes, &Limits::default())
            .unwrap()
            .compile_time
            .cache_hit
    );
}

#[test]
fn compilation_is_bounded_in_time() {
    let limits = Limits {
        max_compile_time: Duration::from_millis(1),
        ..Limits::default()
    };
    let h = PluginHost::new(HostConfig::default()).unwrap();
    let err = h.validate(&dist("dgx-affinity"), &limits).unwrap_err();
    assert_eq!(err.code(), "compile-timeout", "{err}");
    assert!(
        err.is_host_side(),
        "a busy machine compiles slower: retried, not judged"
    );
}
