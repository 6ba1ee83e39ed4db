//! Python plugins (componentize-py output, CPython inside) in the real sandbox: the template
//! and a hostile plugin built by scripts/build-python-plugin.sh. They run under the default
//! limits, and the sandbox holds for them exactly as for Rust plugins.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{compile_cache, dist, fixture, hostile, within};
use heddle_plugin_host::{HostConfig, HostError, Limits, PluginHost, Report};

/// One host for the binary, with a disk cache shared by the test binaries: an 18 MB
/// component is compiled once (the first time, by whichever test gets there first).
fn host() -> &'static PluginHost {
    static HOST: OnceLock<PluginHost> = OnceLock::new();
    HOST.get_or_init(|| {
        let host = PluginHost::new(HostConfig {
            cache_dir: Some(compile_cache()),
            ..HostConfig::default()
        })
        .expect("host");
        // Compiled here once, with room for an unoptimised build on a busy machine.
        for name in ["template-python", "py-misbehave"] {
            host.load(&dist(name), &patient()).expect(name);
        }
        host
    })
}

/// Limits::default(), but for the compile time.
fn patient() -> Limits {
    Limits {
        max_compile_time: Duration::from_secs(900),
        ..Limits::default()
    }
}

fn py(mode: &str) -> Result<Report, HostError> {
    host().run(&dist("py-misbehave"), &hostile(mode), &Limits::default())
}

fn trait_of<'a>(r: &'a Report, key: &str) -> &'a str {
    r.detection
        .traits
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no trait {key}: {:?}", r.detection.traits))
}

#[test]
fn python_template_recommends_an_interface_under_default_limits() {
    let bytes = dist("template-python");
    assert!(
        bytes.len() > 16 << 20,
        "CPython is inside: {} bytes",
        bytes.len()
    );
    let info = host().validate(&bytes, &Limits::default()).unwrap();
    assert_eq!(info.plugin.name, "my-python-plugin");
    assert_eq!(info.contract, "heddle:plugin@0.2.0");
    assert!(
        info.imports.iter().any(|i| i.starts_with("wasi:sockets/")),
        "CPython links sockets: {:?}",
        info.imports
    );
    let r = host()
        .run(&bytes, &fixture("runai-roce.json"), &Limits::default())
        .unwrap();
    let env: Vec<(&str, &str)> = r
        .detection
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(env, [("NCCL_SOCKET_IFNAME", "net1")]);
    // Only the declared fields of each interface reached it: nothing else to echo.
    let r = host()
        .run(&bytes, &fixture("dgx1.json"), &Limits::default())
        .unwrap();
    assert_eq!(r.detection.env[0].value, "enp1s0f0");
    println!(
        "template-python on dgx1: {} fuel, {:?}, peak memory {} bytes",
        r.usage.fuel_consumed, r.usage.elapsed, r.usage.peak_memory_bytes
    );
    assert!(
        host()
            .run(&bytes, r#"{"schema_version": 1}"#, &Limits::default())
            .unwrap()
            .detection
            .is_empty()
    );
}

#[test]
fn python_plugin_gets_an_error_for_every_socket() {
    let r = py("socket").unwrap();
    for key in ["py.connect", "py.resolve", "py.udp"] {
        let got = trait_of(&r, key);
        assert!(got.starts_with("error: "), "{key}: {got}");
    }
    // Refused by the sandbox, not timed out or unreachable by chance.
    assert!(
        trait_of(&r, "py.connect").contains("PermissionError"),
        "{}",
        trait_of(&r, "py.connect")
    );
}

#[test]
fn python_plugin_finds_no_files_and_no_environment() {
    let r = py("file").unwrap();
    for key in ["py.passwd", "py.listdir", "py.write"] {
        let got = trait_of(&r, key);
        assert!(got.starts_with("error: "), "{key}: {got}");
    }
    assert_eq!(trait_of(&r, "py.environ"), "got: []");
}

#[test]
fn python_sleep_loop_and_memory_bomb_are_stopped() {
    let sleepy = Limits {
        timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let err = within(Duration::from_secs(60), move || {
        host()
            .run(&dist("py-misbehave"), &hostile("sleep"), &sleepy)
            .unwrap_err()
    });
    assert_eq!(err.code(), "timeout", "{err}");
    let err = py("loop").unwrap_err();
    assert!(matches!(err.code(), "fuel-exhausted" | "timeout"), "{err}");
    let err = py("memory").unwrap_err();
    assert_eq!(err.code(), "memory-limit", "{err}");
    // The host still serves the same component afterwards.
    assert_eq!(trait_of(&py("ok").unwrap(), "py.ok"), "yes");
}

#[test]
fn python_exception_is_an_error_naming_it_and_where() {
    let err = py("raise").unwrap_err();
    let HostError::Plugin { code, message, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(code, "exception");
    assert!(
        message.starts_with("KeyError: ") && message.contains("app.py:"),
        "{message}"
    );
}
