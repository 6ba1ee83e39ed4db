//! `cargo bench -p heddle-plugin-host`: compile, cold call, warm call and the time the sandbox
//! takes to stop each hostile plugin. Needs scripts/build-plugins.sh to have run. Prints a
//! table; no statistics framework, the numbers are for sizing (how many plugin calls a server
//! core can serve) rather than for catching 2% regressions.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use heddle_plugin_host::{FactsJson, HostConfig, Limits, PluginHost};

fn read(dir: &str, name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(dir)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run scripts/build-plugins.sh first",
            path.display()
        )
    })
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

fn show(label: &str, samples: &mut [Duration]) {
    let p50 = percentile(samples, 0.5);
    let p99 = percentile(samples, 0.99);
    println!(
        "{label:<52} p50 {:>10.1?}  p99 {:>10.1?}  (n={})",
        p50,
        p99,
        samples.len()
    );
}

fn main() {
    let limits = Limits::default();
    let dgx = read("dist", "dgx-affinity.wasm");
    let misbehave = read("dist", "misbehave.wasm");
    let dgx_facts = String::from_utf8(read("fixtures", "dgx1.json")).unwrap();
    let ok_facts = r#"{"hostile": "ok", "host": {"hostname": "bench"}}"#;
    let dgx_checked = FactsJson::parse(&dgx_facts).unwrap();
    let ok_checked = FactsJson::parse(ok_facts).unwrap();

    println!(
        "component sizes: dgx-affinity {} bytes, misbehave {} bytes",
        dgx.len(),
        misbehave.len()
    );

    // Compile: a fresh host each time so nothing is cached. `compile_time` is the
    // Component::from_binary part; the wall time adds the checks, InstancePre and info().
    let mut compile = Vec::new();
    let mut validate = Vec::new();
    for _ in 0..10 {
        let host = PluginHost::new(HostConfig::default()).unwrap();
        let t = Instant::now();
        let info = host.validate(&dgx, &limits).unwrap();
        validate.push(t.elapsed());
        compile.push(Duration::from_micros(info.compile_time.micros));
    }
    show(
        "compile dgx-affinity (Component::from_binary)",
        &mut compile,
    );
    show(
        "validate dgx-affinity (compile+checks+info())",
        &mut validate,
    );

    // Cold call: first run of a component on a new host.
    let mut cold = Vec::new();
    for _ in 0..10 {
        let host = PluginHost::new(HostConfig::default()).unwrap();
        let t = Instant::now();
        host.run(&dgx, &dgx_facts, &limits).unwrap();
        cold.push(t.elapsed());
    }
    show("cold call dgx-affinity on DGX-1 facts", &mut cold);

    for (label, config) in [
        ("on-demand", HostConfig::default()),
        (
            "pooling",
            HostConfig {
                pooling_instances: Some(16),
                ..HostConfig::default()
            },
        ),
    ] {
        let host = PluginHost::new(config).unwrap();
        let trivial = host.load(&misbehave, &limits).unwrap();
        let dgx_loaded = host.load(&dgx, &limits).unwrap();
        let mut warm = Vec::new();
        let mut fuel = 0;
        for _ in 0..2000 {
            let t = Instant::now();
            host.run(&misbehave, ok_facts, &limits).unwrap();
            warm.push(t.elapsed());
        }
        show(
            &format!("warm run(bytes), trivial plugin, {label}"),
            &mut warm,
        );
        let mut warm = Vec::new();
        for _ in 0..2000 {
            let t = Instant::now();
            let r = host.call(&trivial, &ok_checked, &limits).unwrap();
            warm.push(t.elapsed());
            fuel = r.usage.fuel_consumed;
        }
        show(
            &format!("warm call(handle), trivial plugin, {label} (fuel {fuel})"),
            &mut warm,
        );
        let mut warm = Vec::new();
        for _ in 0..500 {
            let t = Instant::now();
            let r = host.call(&dgx_loaded, &dgx_checked, &limits).unwrap();
            warm.push(t.elapsed());
            fuel = r.usage.fuel_consumed;
        }
        show(
            &format!("warm call(handle), dgx-affinity on DGX-1, {label} (fuel {fuel})"),
            &mut warm,
        );
    }

    println!();
    println!("each first-party plugin on each fixture (warm, on-demand; min of 200 calls):");
    let host = PluginHost::new(HostConfig::default()).unwrap();
    let plugins: Vec<_> = ["azure-nd", "runai-roce", "dgx-affinity"]
        .into_iter()
        .map(|p| {
            (
                p,
                host.load(&read("dist", &format!("{p}.wasm")), &limits)
                    .unwrap(),
            )
        })
        .collect();
    for fixture in ["azure-nd40rs-v2", "runai-roce", "dgx1"] {
        let json = String::from_utf8(read("fixtures", &format!("{fixture}.json"))).unwrap();
        let facts = FactsJson::parse(&json).unwrap();
        let mut line = format!("  {fixture:<16} ({:>5} bytes)", json.len());
        for (name, plugin) in &plugins {
            let mut best = Duration::MAX;
            let mut fuel = 0;
            for _ in 0..200 {
                let t = Instant::now();
                let r = host.call(plugin, &facts, &limits).unwrap();
                best = best.min(t.elapsed());
                fuel = r.usage.fuel_consumed;
            }
            line += &format!("  {name} {best:>8.1?} ({fuel} fuel)");
        }
        println!("{line}");
    }

    println!();
    println!("time to stop hostile plugins (warm host):");
    let host = PluginHost::new(HostConfig::default()).unwrap();
    host.validate(&misbehave, &limits).unwrap();
    let cases: [(&str, &str, Limits); 7] = [
        (
            "loop, fuel 20M",
            "loop",
            Limits {
                fuel: 20_000_000,
                ..limits
            },
        ),
        ("loop, default fuel 500M", "loop", limits),
        (
            "loop, fuel unlimited, timeout 100 ms",
            "loop",
            Limits {
                fuel: u64::MAX / 2,
                timeout: Duration::from_millis(100),
                ..limits
            },
        ),
        ("memory bomb, cap 64 MiB", "memory", limits),
        ("8 MiB output, cap 1 MiB", "output", limits),
        ("panic", "panic", limits),
        ("abort (unreachable)", "trap", limits),
    ];
    for (label, mode, case_limits) in cases {
        let facts = format!(r#"{{"hostile": "{mode}"}}"#);
        let mut samples = Vec::new();
        let mut code = "";
        for _ in 0..5 {
            let t = Instant::now();
            let err = host.run(&misbehave, &facts, &case_limits).unwrap_err();
            samples.push(t.elapsed());
            code = err.code();
        }
        show(&format!("{label} -> {code}"), &mut samples);
    }
    let netclient = read("dist", "netclient.wasm");
    let mut samples = Vec::new();
    for _ in 0..5 {
        let fresh = PluginHost::new(HostConfig::default()).unwrap();
        let t = Instant::now();
        let err = fresh.validate(&netclient, &limits).unwrap_err();
        samples.push(t.elapsed());
        assert_eq!(err.code(), "disallowed-import");
    }
    show("wasi:sockets import refused (incl. compile)", &mut samples);
}
