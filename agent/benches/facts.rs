//! Time to collect node facts, on each fixture tree and on this machine's `/`.
//!
//! `cargo bench -p heddle-agent --bench facts`. Prints min / median / max per target; the
//! agent re-collects facts on every report, so `/` should stay well under 300 ms.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use heddle_agent::facts::{CollectOptions, collect, facts_sha256};

const TARGET: Duration = Duration::from_millis(300);

fn measure(label: &str, opts: &CollectOptions, runs: usize) -> Duration {
    // One warm-up run: the first dlopen of NVML/libibverbs and the page cache are paid once
    // per agent process, not per report.
    let warm = Instant::now();
    let facts = collect(opts);
    let first = warm.elapsed();
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(collect(opts));
            t.elapsed()
        })
        .collect();
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "{label:<28} first {:>8.2} ms   min {:>8.2} ms   median {:>8.2} ms   max {:>8.2} ms   ({runs} runs, {} GPUs, {} RDMA devs, {} errors, hash {})",
        ms(first),
        ms(times[0]),
        ms(median),
        ms(*times.last().unwrap()),
        facts.gpus.len(),
        facts.rdma.devices.len(),
        facts.errors.len(),
        &facts_sha256(&facts)[..12],
    );
    median
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for name in ["azure-nd40rs-v2", "runai-roce-pod", "dgx1", "ethernet-box"] {
        measure(name, &CollectOptions::for_root(fixtures.join(name)), 50);
    }
    let live = measure("/ (this machine)", &CollectOptions::default(), 20);
    let verdict = if live < TARGET { "within" } else { "OVER" };
    println!(
        "live median {:.2} ms: {verdict} the {} ms target",
        ms(live),
        TARGET.as_millis()
    );
}
