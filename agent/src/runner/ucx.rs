//! `ucx`: UCX's `ucx_perftest` between a server and a client, either both on this node
//! over the loopback address (what UCX picks there: shared memory, CMA or TCP, under the
//! job's `UCX_TLS`) or across two nodes (rank 0 serves, rank 1 connects; rank 0 hands
//! its address over through the server's rendezvous). Also records what `ucx_info -d`
//! says the node has, so a slow figure can be read against the transports UCX could use.
//!
//! Params: `tests` (default `["tag_lat", "tag_bw"]`), `sizes` in bytes (default 8, 4 KiB,
//! 64 KiB, 1 MiB), `iters` (default 10000), `warmup` (default 1000), `memory` (`host`,
//! or `cuda` where UCX was built with it), `server_host` (two-node runs; default this
//! node's hostname).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use heddle_types::jobs::ResultRow;
use heddle_types::transport::UcxEvidence;
use serde_json::{Map, Value, json};

use super::child_env;
use super::nccl::rendezvous::Rendezvous;
use super::protocol::{ChildEvent, ChildInput};
use super::ucx_parse::{self, PerfResult};
use heddle_types::kinds::ucx::UcxParams;
use heddle_types::params::KindParams;

use super::{RunError, Sink};

/// UCP tests ucx_perftest runs between two processes (the UCT ones need a device name).
pub use heddle_types::kinds::ucx::UCX_TESTS as TESTS;
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
const RENDEZVOUS_NAME: &str = "ucx-server";

#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub tests: Vec<String>,
    pub sizes: Vec<u64>,
    pub iters: u64,
    pub warmup: u64,
    pub memory: String,
    pub server_host: Option<String>,
}

impl Params {
    /// Decodes a job's params through the wire type the server checked them with.
    pub fn parse(p: &Value) -> Result<Params, RunError> {
        let t = UcxParams::decode(p).map_err(|e| RunError::Params(e.to_string()))?;
        Ok(Params {
            tests: t.tests,
            sizes: t.sizes,
            iters: t.iters,
            warmup: t.warmup,
            memory: t.memory,
            server_host: t.server_host,
        })
    }

    fn test_args(&self, test: &str, size: u64, port: u16) -> Vec<String> {
        vec![
            "-t".into(),
            test.into(),
            "-s".into(),
            size.to_string(),
            "-n".into(),
            self.iters.to_string(),
            "-w".into(),
            self.warmup.to_string(),
            "-m".into(),
            self.memory.clone(),
            "-p".into(),
            port.to_string(),
        ]
    }
}

/// `PATH` lookup without running anything.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| p.is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// UCX logs the lanes it selects for an endpoint at `info`; the run's own
/// `UCX_LOG_LEVEL` wins when it has one (then the lanes may go unrecorded).
fn perftest_command() -> Command {
    let mut cmd = child_env::command("ucx_perftest");
    if std::env::var_os("UCX_LOG_LEVEL").is_none() {
        cmd.env("UCX_LOG_LEVEL", "info");
    }
    cmd
}

/// A `ucx_perftest` server and a reader of its output (the lanes it selected). Its
/// "Waiting for connection" line cannot serve as a readiness signal (stdio is
/// block-buffered into a pipe), so the client retries instead.
struct Server {
    child: Child,
    output: std::thread::JoinHandle<String>,
}

fn start_server(port: u16) -> Result<Server, RunError> {
    let mut child = perftest_command()
        .args(["-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let out = child.stdout.take().expect("piped");
    let output = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    Ok(Server { child, output })
}

impl Server {
    /// Waits for the server to end (killing it after `timeout`); its output, and whether
    /// it ended by itself.
    fn finish(mut self, timeout: Duration) -> std::io::Result<(String, bool)> {
        let ended = wait_with_timeout(&mut self.child, timeout)?.is_some();
        Ok((self.output.join().unwrap_or_default(), ended))
    }
}

fn wait_with_timeout(
    child: &mut Child,
    timeout: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Some(st));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the client against `host:port` and parses its table, retrying while the server
/// is not listening yet.
fn run_client(host: &str, args: &[String]) -> Result<(PerfResult, String), RunError> {
    let mut attempt = 0;
    loop {
        match run_client_once(host, args) {
            Err(RunError::Failed { message, .. })
                if attempt < 50 && message.contains("connect") =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(100));
                tracing::debug!(%message, attempt, "ucx_perftest server not ready");
            }
            other => return other,
        }
    }
}

fn run_client_once(host: &str, args: &[String]) -> Result<(PerfResult, String), RunError> {
    let mut child = perftest_command()
        .arg(host)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let err_t = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let status = wait_with_timeout(&mut child, STEP_TIMEOUT)?;
    let (stdout, stderr) = (
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default(),
    );
    match status {
        None => Err(RunError::Failed {
            code: 1,
            message: format!(
                "ucx_perftest {} timed out after {STEP_TIMEOUT:?}",
                args.join(" ")
            ),
        }),
        Some(st) if !st.success() => Err(RunError::Failed {
            code: 1,
            message: format!(
                "ucx_perftest {} failed ({st}): {}",
                args.join(" "),
                stderr
                    .lines()
                    .chain(stdout.lines())
                    .rfind(|l| !l.trim().is_empty())
                    .unwrap_or("")
            ),
        }),
        Some(_) => parse(&stdout).map(|r| (r, format!("{stdout}\n{stderr}"))),
    }
}

fn parse(stdout: &str) -> Result<PerfResult, RunError> {
    ucx_parse::parse_perftest(stdout).map_err(|m| RunError::Failed {
        code: 1,
        message: m,
    })
}

pub fn row(test: &str, size: u64, r: &PerfResult) -> Option<ResultRow> {
    let f = r.final_line()?;
    Some(ResultRow {
        size_bytes: size as i64,
        count: None,
        dtype: None,
        op: Some(test.into()),
        root: None,
        in_place: None,
        time_us: Some(f.average_us),
        // MiB/s to GB/s.
        algbw_gbs: Some(f.bw_overall_mbs * 1_048_576.0 / 1e9),
        busbw_gbs: None,
        wrong: None,
        labels: Default::default(),
        extra: json!({
            "time_metric": r.time_metric,
            "percentile_us": f.percentile_us,
            "overall_us": f.overall_us,
            "bw_overall_mibs": f.bw_overall_mbs,
            "msgrate_overall": f.msgrate_overall,
            "iterations": f.iterations,
        }),
    })
}

/// Adds the lanes a `ucx_perftest` process logged to the evidence.
fn absorb(evidence: &mut UcxEvidence, output: &str) {
    let (lanes, line) = ucx_parse::parse_ep_cfg(output);
    evidence.selected.extend(lanes);
    if evidence.selected_line.is_none() {
        evidence.selected_line = line;
    }
}

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = Params::parse(&input.params)?;
    if which("ucx_perftest").is_none() {
        return Err(RunError::Skip(
            "ucx_perftest not found in PATH (install UCX's tools, e.g. the ucx-utils package)"
                .into(),
        ));
    }
    let world = input.world_size.max(1);
    if world > 2 {
        return Err(RunError::Params(format!(
            "ucx runs on one node or between two, not {world}"
        )));
    }
    let mut summary = Map::new();
    let mut evidence = UcxEvidence {
        mode: Some(if world == 1 { "loopback" } else { "two-node" }.into()),
        ..Default::default()
    };
    summary.insert("kind".into(), "ucx".into());
    summary.insert(
        "mode".into(),
        if world == 1 { "loopback" } else { "two-node" }.into(),
    );
    if let Ok(o) = child_env::command("ucx_info").arg("-v").output()
        && let Some(v) = ucx_parse::parse_version(&String::from_utf8_lossy(&o.stdout))
    {
        summary.insert("ucx_version".into(), v.into());
    }
    if let Ok(o) = child_env::command("ucx_info").arg("-d").output() {
        let tl = ucx_parse::parse_info_devices(&String::from_utf8_lossy(&o.stdout));
        let names: Vec<String> = tl
            .iter()
            .map(|t| format!("{}/{}", t.transport, t.device))
            .collect();
        evidence.available = names.iter().cloned().collect();
        summary.insert("ucx_transports".into(), json!(names));
    }
    let env: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("UCX_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    summary.insert("ucx_env".into(), json!(env));

    let steps: Vec<(&String, u64)> = params
        .tests
        .iter()
        .flat_map(|t| params.sizes.iter().map(move |&s| (t, s)))
        .collect();
    let rendezvous = if world == 2 {
        Some(Rendezvous::for_job(input).ok_or_else(|| RunError::Failed {
            code: 1,
            message: "a two-node ucx job needs the server rendezvous, but the agent passed none to the test process".into(),
        })?)
    } else {
        None
    };
    for (i, (test, size)) in steps.iter().enumerate() {
        let step_name = format!("{RENDEZVOUS_NAME}-{i}");
        let result = match (world, input.rank) {
            (1, _) => {
                let port = free_port()?;
                let server = start_server(port)?;
                let r = run_client("127.0.0.1", &params.test_args(test, *size, port));
                let (output, ended) = server.finish(Duration::from_secs(5))?;
                if !ended {
                    tracing::warn!("ucx_perftest server did not exit after its client; killed");
                }
                absorb(&mut evidence, &output);
                Some(r?)
            }
            (_, 0) => {
                // Serve, and tell rank 1 where.
                let port = free_port()?;
                let server = start_server(port)?;
                let host = params.server_host.clone().unwrap_or_else(|| {
                    nix::unistd::gethostname()
                        .map(|h| h.to_string_lossy().into_owned())
                        .unwrap_or_else(|_| "localhost".into())
                });
                let rv = rendezvous.as_ref().expect("two-node runs have one");
                rv.exchange_named(
                    &step_name,
                    true,
                    Some(format!("{host}:{port}").into_bytes()),
                    STEP_TIMEOUT,
                )
                .map_err(|m| RunError::Failed {
                    code: 1,
                    message: m,
                })?;
                let (output, ended) = server.finish(STEP_TIMEOUT)?;
                if !ended {
                    return Err(RunError::Failed {
                        code: 1,
                        message: format!("no client connected for {test} {size} B"),
                    });
                }
                absorb(&mut evidence, &output);
                None
            }
            _ => {
                let rv = rendezvous.as_ref().expect("two-node runs have one");
                let addr = rv
                    .exchange_named(&step_name, false, None, STEP_TIMEOUT)
                    .map_err(|m| RunError::Failed {
                        code: 1,
                        message: m,
                    })?;
                let addr = String::from_utf8_lossy(&addr).into_owned();
                let (host, port) = addr.rsplit_once(':').ok_or_else(|| RunError::Failed {
                    code: 1,
                    message: format!("bad server address {addr:?}"),
                })?;
                let port: u16 = port.parse().map_err(|_| RunError::Failed {
                    code: 1,
                    message: format!("bad port in {addr:?}"),
                })?;
                Some(run_client(host, &params.test_args(test, *size, port))?)
            }
        };
        if let Some((_, raw)) = &result {
            absorb(&mut evidence, raw);
        }
        if let Some((r, _raw)) = result
            && let Some(row) = row(test, *size, &r)
        {
            let msg = format!(
                "{test} {size} B: {:.2} us, {:.3} GB/s",
                row.time_us.unwrap_or(0.0),
                row.algbw_gbs.unwrap_or(0.0)
            );
            out.row(row)?;
            out.progress(Some((i + 1) as f64 / steps.len() as f64), msg)?;
        }
    }
    summary.insert("ucx_evidence".into(), json!(evidence));
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params() {
        let p = Params::parse(&json!({})).unwrap();
        assert_eq!(p.tests, vec!["tag_lat", "tag_bw"]);
        assert_eq!(p.sizes.len(), 4);
        let p = Params::parse(
            &json!({"tests": ["ucp_put_bw"], "sizes": [1024], "iters": 5, "memory": "cuda"}),
        )
        .unwrap();
        assert_eq!(
            p.test_args("ucp_put_bw", 1024, 9)[..4],
            ["-t", "ucp_put_bw", "-s", "1024"].map(String::from)
        );
        for bad in [
            json!({"tests": ["rm_rf"]}),
            json!({"tests": "tag_bw"}),
            json!({"sizes": [0]}),
            json!({"sizes": [-1]}),
            json!({"memory": "disk"}),
            json!({"iters": 0}),
            json!({"tests": []}),
        ] {
            assert!(
                matches!(Params::parse(&bad), Err(RunError::Params(_))),
                "{bad}"
            );
        }
    }
}
