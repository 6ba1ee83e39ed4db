//! A deliberately hostile plugin for the host's containment tests and benchmark. What it does
//! is chosen by the `hostile` key of the facts it is given, so one component covers every
//! misbehaviour a real plugin could exhibit.

use heddle_plugin_sdk::{Detection, Facts, Info, Plugin, PluginError, log};

pub struct Misbehave;

impl Plugin for Misbehave {
    fn info() -> Info {
        Info::new(
            "misbehave",
            env!("CARGO_PKG_VERSION"),
            "misbehaves on request (host tests only)",
        )
        .reads(&["/hostile", "/seed", "/host/hostname"])
    }

    fn detect(facts: &Facts) -> Result<Detection, PluginError> {
        let mut d = Detection::default();
        match facts.str_at("/hostile").unwrap_or("ok") {
            "ok" => {
                log::info("behaving");
                d.add_trait(
                    "misbehave.host",
                    facts.str_at("/host/hostname").unwrap_or("?"),
                );
            }
            "loop" => {
                let mut x: u64 = facts.u64_at("/seed").unwrap_or(1);
                loop {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "memory" => {
                // Grows by 1 MiB pages and touches them so nothing can be optimised away.
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    let mut page = vec![0u8; 1 << 20];
                    page[hoard.len() % (1 << 20)] = 1;
                    hoard.push(std::hint::black_box(page));
                }
            }
            "output" => {
                let big = "x".repeat(1 << 20);
                for i in 0..8 {
                    d.add_trait(&format!("junk.{i}"), &big);
                }
            }
            "echo" => {
                d.add_trait("misbehave.facts", &facts.root().to_string());
            }
            "recurse" => {
                d.add_trait(
                    "misbehave.depth",
                    &depth(facts.u64_at("/seed").unwrap_or(1)).to_string(),
                );
            }
            "sleep" => {
                // A WASI clock wait: host code, out of reach of fuel and the epoch deadline.
                let secs = facts.u64_at("/seed").unwrap_or(3600);
                std::thread::sleep(std::time::Duration::from_secs(secs));
                d.add_trait("misbehave.slept", &secs.to_string());
            }
            "nap" => {
                // A wait that ends well before any deadline is allowed.
                std::thread::sleep(std::time::Duration::from_millis(20));
                d.add_trait("misbehave.slept", "20ms");
            }
            "file" => {
                // Nothing is preopened, so no path names a file.
                let found = std::fs::read_to_string("/etc/passwd")
                    .map_err(|e| PluginError::new("file", e.to_string()))?;
                d.add_trait("misbehave.passwd", &found);
            }
            "panic" => panic!("misbehave was asked to panic"),
            "trap" => {
                // A plain wasm `unreachable` with no panic message.
                std::process::abort();
            }
            "log-flood" => {
                for i in 0..100_000 {
                    log::warn(&format!("flood {i}"));
                }
                d.add_trait("misbehave.logged", "100000");
            }
            "stdout-flood" => {
                let line = "y".repeat(1023);
                for _ in 0..16 * 1024 {
                    println!("{line}");
                }
                d.add_trait("misbehave.printed", "16 MiB");
            }
            "error" => {
                return Err(PluginError::new(
                    "unsupported",
                    "misbehave was asked to fail",
                ));
            }
            other => {
                return Err(PluginError::bad_facts(format!(
                    "unknown hostile mode {other}"
                )));
            }
        }
        Ok(d)
    }
}

/// Unbounded, non-tail recursion: only the host's wasm stack limit stops it.
#[allow(unconditional_recursion)]
fn depth(n: u64) -> u64 {
    std::hint::black_box(depth(std::hint::black_box(n + 1))).wrapping_add(1)
}

heddle_plugin_sdk::export_plugin!(Misbehave);
