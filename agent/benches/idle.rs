//! What an idle agent costs its node: resident memory and CPU of `heddle-agent run` while
//! it heartbeats and polls for jobs against a real server, sampled from /proc.
//!
//! `cargo bench -p heddle-agent --bench idle -- [--seconds 30] [--heartbeat-s 10]
//! [--claim-interval 5s]` with `HEDDLE_TEST_DATABASE_URL` set. Targets: RSS < 40 MB,
//! CPU < 0.5 %.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use heddle_server::testing::TestServer;

struct Opts {
    seconds: u64,
    heartbeat_s: u32,
    claim_interval: String,
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        seconds: 30,
        heartbeat_s: 10,
        claim_interval: "5s".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                o.seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seconds N")
            }
            "--heartbeat-s" => {
                o.heartbeat_s = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--heartbeat-s N")
            }
            "--claim-interval" => o.claim_interval = args.next().expect("--claim-interval D"),
            // `cargo bench` passes `--bench`; other harness flags are ignored too.
            _ => {}
        }
    }
    o
}

/// (VmRSS kB, VmHWM kB, threads)
fn status(pid: u32) -> (u64, u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent alive");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"), field("Threads:"))
}

/// utime + stime, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("agent alive");
    let after_comm = stat.rsplit(')').next().unwrap();
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 of stat; `after_comm` starts at field 3.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn main() {
    let opts = parse_opts();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hb = opts.heartbeat_s;
        let server = TestServer::start_with(|c| c.heartbeat_interval_s = hb).await;
        let token = server.enrollment_token().await;
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Command::new(env!("CARGO_BIN_EXE_heddle-agent"))
            .args(["run", "--server", &server.url, "--enroll-token", &token])
            .args(["--state-dir", dir.path().join("state").to_str().unwrap()])
            .args(["--hostname", "idle-bench", "--claim-interval", &opts.claim_interval])
            .env("HEDDLE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting heddle-agent");
        let pid = agent.id();

        // Start-up (enrollment, first fact collection) is not idle time.
        let http = reqwest::Client::new();
        let start = Instant::now();
        loop {
            let r = http
                .get(format!("{}/api/v1/nodes/idle-bench", server.url))
                .bearer_auth(&server.admin_token)
                .send()
                .await
                .unwrap();
            if r.status() == 200 {
                let v: serde_json::Value = r.json().await.unwrap();
                if !v["facts"].is_null() {
                    break;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(60), "agent did not enroll");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;

        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let t0 = Instant::now();
        let ticks0 = cpu_ticks(pid);
        let mut rss = Vec::new();
        let mut threads = 0;
        while t0.elapsed() < Duration::from_secs(opts.seconds) {
            let (r, _, t) = status(pid);
            rss.push(r);
            threads = threads.max(t);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu_s = (cpu_ticks(pid) - ticks0) as f64 / hz;
        let (_, hwm, _) = status(pid);
        let mb = |kb: u64| kb as f64 / 1024.0;
        let avg = rss.iter().sum::<u64>() as f64 / rss.len() as f64;
        println!("idle heddle-agent over {wall:.1} s (heartbeat {hb} s, claim interval {}):", opts.claim_interval);
        println!(
            "  RSS     min {:.1} MB, mean {:.1} MB, max {:.1} MB; peak since start (VmHWM) {:.1} MB",
            mb(*rss.iter().min().unwrap()),
            avg / 1024.0,
            mb(*rss.iter().max().unwrap()),
            mb(hwm)
        );
        println!(
            "  CPU     {cpu_s:.3} s user+system = {:.3} % of one core",
            cpu_s / wall * 100.0
        );
        println!("  threads at most {threads}");
        let _ = agent.kill();
        let _ = agent.wait();
        server.stop().await;
    });
}
