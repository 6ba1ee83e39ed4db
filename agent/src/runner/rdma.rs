//! `rdma`: perftest (`ib_write_bw`, `ib_read_lat`, ...) between two ends on the same HCA
//! (server and client on this node) or across two nodes (rank 0 serves). The node's RDMA
//! devices are checked first, so a node without an HCA ends `skipped` with what was looked
//! at, rather than `failed` with perftest's "Unable to find the Infiniband/RoCE device".
//!
//! Params: `test` (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat, ib_read_lat,
//! ib_send_lat; default ib_write_bw), `device` (e.g. `mlx5_0`; default the first),
//! `ib_port` (default 1), `gid_index` (RoCE; see seed runbooks on finding the RoCE v2
//! index), `size` (bytes) or `all: true` (perftest's `-a` sweep, the default), `iters`,
//! `server_host` (two-node runs), `port` (perftest's TCP port, default 18515).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use heddle_types::jobs::ResultRow;
use heddle_types::transport::PerftestEvidence;
use serde_json::{Map, Value, json};

use super::child_env;
use super::nccl::rendezvous::Rendezvous;
use super::protocol::{ChildEvent, ChildInput};
use heddle_types::kinds::rdma::RdmaParams;
use heddle_types::params::KindParams;

use super::{RunError, Sink};

pub use super::child_env::RDMA_SYSFS_ENV as SYSFS_ENV;
pub use heddle_types::kinds::rdma::PERFTESTS as TESTS;

#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub test: String,
    pub device: Option<String>,
    pub ib_port: u64,
    pub gid_index: Option<u64>,
    pub size: Option<u64>,
    pub iters: Option<u64>,
    pub server_host: Option<String>,
    pub port: u64,
}

impl Params {
    /// Decodes a job's params through the wire type the server checked them with.
    pub fn parse(p: &Value) -> Result<Params, RunError> {
        let t = RdmaParams::decode(p).map_err(|e| RunError::Params(e.to_string()))?;
        Ok(Params {
            test: t.test,
            device: t.device,
            ib_port: t.ib_port,
            gid_index: t.gid_index,
            size: match (t.size, t.all) {
                (Some(size), _) => Some(size),
                (None, true) => None,
                (None, false) => Some(65536),
            },
            iters: t.iters,
            server_host: t.server_host,
            port: t.port,
        })
    }

    pub fn args(&self, device: &str) -> Vec<String> {
        let mut a = vec![
            "-d".into(),
            device.into(),
            "-i".into(),
            self.ib_port.to_string(),
            "-p".into(),
            self.port.to_string(),
        ];
        if let Some(g) = self.gid_index {
            a.extend(["-x".into(), g.to_string()]);
        }
        match self.size {
            Some(s) => a.extend(["-s".into(), s.to_string()]),
            None => a.push("-a".into()),
        }
        if let Some(n) = self.iters {
            a.extend(["-n".into(), n.to_string()]);
        }
        a
    }
}

/// The devices under `<sysfs>/class/infiniband`, or why there are none.
pub fn rdma_devices(sysfs: &Path) -> Result<Vec<String>, String> {
    let dir = sysfs.join("class/infiniband");
    let entries =
        std::fs::read_dir(&dir).map_err(|e| format!("{} is absent ({e})", dir.display()))?;
    let mut devs: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    devs.sort();
    if devs.is_empty() {
        return Err(format!("{} is empty", dir.display()));
    }
    Ok(devs)
}

/// Picks the device and checks port and GID index exist, with the evidence on failure.
pub fn check_device(sysfs: &Path, p: &Params) -> Result<String, String> {
    let devs = rdma_devices(sysfs)?;
    let dev = match &p.device {
        Some(d) if !devs.contains(d) => {
            return Err(format!(
                "{d} is not among the RDMA devices ({})",
                devs.join(", ")
            ));
        }
        Some(d) => d.clone(),
        None => devs[0].clone(),
    };
    let port = sysfs.join(format!("class/infiniband/{dev}/ports/{}", p.ib_port));
    if !port.is_dir() {
        return Err(format!(
            "{dev} has no port {} ({} is absent)",
            p.ib_port,
            port.display()
        ));
    }
    if let Some(g) = p.gid_index {
        let gid = port.join(format!("gids/{g}"));
        let text = std::fs::read_to_string(&gid).map_err(|e| {
            format!(
                "GID index {g} of {dev} port {}: {} unreadable ({e})",
                p.ib_port,
                gid.display()
            )
        })?;
        if text.trim().chars().all(|c| c == '0' || c == ':') {
            return Err(format!(
                "GID index {g} of {dev} port {} is empty ({})",
                p.ib_port,
                text.trim()
            ));
        }
    }
    Ok(dev)
}

/// One result line of a perftest table, by column name.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PerfRow {
    pub bytes: u64,
    pub iterations: u64,
    pub columns: Vec<(String, f64)>,
}

impl PerfRow {
    pub fn get(&self, prefix: &str) -> Option<f64> {
        self.columns
            .iter()
            .find(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
    }
}

/// Longest column name kept from a perftest header (its own are under 20 characters),
/// and most columns: every row repeats the names, so a long one would be copied once per
/// row of a hostile or broken output.
const MAX_COLUMN_NAME: usize = 48;
const MAX_COLUMNS: usize = 16;

/// perftest's result table: the `#bytes` header, then one line per size. Column names
/// contain single spaces (`BW peak[MB/sec]`), so the header splits on runs of two or more.
pub fn parse_perftest(text: &str) -> Result<Vec<PerfRow>, String> {
    let mut header: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("#bytes") {
            let mut cols = Vec::new();
            for part in t.split("  ").map(str::trim).filter(|s| !s.is_empty()) {
                // The latency header runs "#bytes #iterations" together.
                if let Some(rest) = part.strip_prefix("#bytes ") {
                    cols.push("#bytes".to_string());
                    cols.push(rest.trim().to_string());
                } else {
                    cols.push(part.to_string());
                }
            }
            cols.truncate(MAX_COLUMNS);
            for c in &mut cols {
                c.truncate(clipped(c, MAX_COLUMN_NAME).len());
            }
            header = Some(cols);
            continue;
        }
        let Some(cols) = &header else { continue };
        let vals: Vec<f64> = match t
            .split_whitespace()
            .map(str::parse::<f64>)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(v) if v.len() >= 2 => v,
            _ => continue,
        };
        rows.push(PerfRow {
            bytes: vals[0] as u64,
            iterations: vals[1] as u64,
            columns: cols
                .iter()
                .skip(2)
                .cloned()
                .zip(vals.iter().skip(2).copied())
                .collect(),
        });
    }
    if rows.is_empty() {
        return Err(
            match text
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with('-'))
            {
                Some(first) => format!(
                    "no result table in perftest output (it said: {})",
                    clipped(first, 200)
                ),
                None => "no result table in perftest output".into(),
            },
        );
    }
    Ok(rows)
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn clipped(s: &str, max: usize) -> &str {
    let end = (0..=max.min(s.len()))
        .rev()
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(0);
    &s[..end]
}

/// What perftest's header says about the path: `Device : mlx5_0`, `Link type : IB`,
/// `Mtu : 4096[B]`, `GID index : 3`, `Transport type : IB` (two `key : value` pairs may
/// share a line, separated by tabs).
pub fn parse_header(text: &str, port: u32) -> PerftestEvidence {
    let mut ev = PerftestEvidence {
        port: Some(port),
        ..Default::default()
    };
    for line in text.lines() {
        for pair in line
            .split('\t')
            .filter(|p| p.contains(" : ") || p.contains(": "))
        {
            let Some((k, v)) = pair.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            match k {
                "Device" => ev.device = Some(v.to_string()),
                "Link type" => ev.link_layer = Some(v.to_string()),
                "Transport type" => ev.transport = Some(v.to_string()),
                "Mtu" => ev.mtu = v.trim_end_matches("[B]").trim().parse().ok(),
                "GID index" => {
                    ev.gid_index = v.split_whitespace().next().and_then(|g| g.parse().ok())
                }
                _ => {}
            }
        }
    }
    ev
}

pub fn row(test: &str, r: &PerfRow) -> ResultRow {
    let gbits = r.columns.iter().any(|(k, _)| k.contains("Gb/sec"));
    let bw = r.get("BW average").map(|v| {
        if gbits {
            v / 8.0
        } else {
            v * 1_048_576.0 / 1e9
        }
    });
    let lat = r.get("t_avg").or_else(|| r.get("t_typical"));
    let extra: Map<String, Value> = r
        .columns
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    ResultRow {
        size_bytes: r.bytes as i64,
        count: Some(r.iterations as i64),
        dtype: None,
        op: Some(test.into()),
        root: None,
        in_place: None,
        time_us: lat,
        algbw_gbs: bw,
        busbw_gbs: None,
        wrong: None,
        labels: Default::default(),
        extra: Value::Object(extra),
    }
}

fn run_tool(test: &str, args: &[String], host: Option<&str>) -> Result<String, RunError> {
    let mut cmd = child_env::command(test);
    cmd.args(args).stdin(Stdio::null());
    if let Some(h) = host {
        cmd.arg(h);
    }
    let out = cmd.output()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(RunError::Failed {
            code: 1,
            message: format!(
                "{test} failed ({}): {}",
                out.status,
                text.lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
            ),
        });
    }
    Ok(text)
}

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = Params::parse(&input.params)?;
    let sysfs = std::env::var_os(SYSFS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys"));
    let device = check_device(&sysfs, &params)
        .map_err(|why| RunError::Skip(format!("no RDMA device: {why}")))?;
    if super::ucx::which(&params.test).is_none() {
        return Err(RunError::Skip(format!(
            "{} not found in PATH (install perftest)",
            params.test
        )));
    }
    let args = params.args(&device);
    let world = input.world_size.max(1);
    let text = match (world, input.rank) {
        (1, _) => {
            // Server first; perftest's client retries its TCP connect briefly, so a short
            // head start is enough.
            let mut server = child_env::command(&params.test)
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            std::thread::sleep(Duration::from_millis(500));
            let client = run_tool(&params.test, &args, Some("127.0.0.1"));
            let _ = server.wait();
            client?
        }
        (2, rank) => {
            let rv = Rendezvous::for_job(input).ok_or_else(|| RunError::Failed {
                code: 1,
                message: "a two-node rdma job needs the server rendezvous, but the agent passed none to the test process".into(),
            })?;
            if rank == 0 {
                let server = child_env::command(&params.test)
                    .args(&args)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()?;
                let host = params.server_host.clone().unwrap_or_else(|| {
                    nix::unistd::gethostname()
                        .map(|h| h.to_string_lossy().into_owned())
                        .unwrap_or_default()
                });
                rv.exchange_named(
                    "rdma-server",
                    true,
                    Some(host.into_bytes()),
                    Duration::from_secs(120),
                )
                .map_err(|m| RunError::Failed {
                    code: 1,
                    message: m,
                })?;
                let o = server.wait_with_output()?;
                String::from_utf8_lossy(&o.stdout).into_owned()
            } else {
                let host = rv
                    .exchange_named("rdma-server", false, None, Duration::from_secs(120))
                    .map_err(|m| RunError::Failed {
                        code: 1,
                        message: m,
                    })?;
                std::thread::sleep(Duration::from_millis(500));
                run_tool(&params.test, &args, Some(&String::from_utf8_lossy(&host)))?
            }
        }
        (n, _) => {
            return Err(RunError::Params(format!(
                "rdma runs on one node or between two, not {n}"
            )));
        }
    };
    let rows = parse_perftest(&text).map_err(|m| RunError::Failed {
        code: 1,
        message: m,
    })?;
    for r in &rows {
        out.row(row(&params.test, r))?;
    }
    let mut summary = Map::new();
    summary.insert("kind".into(), "rdma".into());
    summary.insert("test".into(), params.test.clone().into());
    summary.insert("device".into(), device.into());
    summary.insert("ib_port".into(), params.ib_port.into());
    if let Some(g) = params.gid_index {
        summary.insert("gid_index".into(), g.into());
    }
    summary.insert(
        "perftest_evidence".into(),
        json!(parse_header(&text, params.ib_port as u32)),
    );
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysfs_with(dev: &str, gid: Option<(u32, &str)>) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let port = t
            .path()
            .join(format!("class/infiniband/{dev}/ports/1/gids"));
        std::fs::create_dir_all(&port).unwrap();
        if let Some((i, g)) = gid {
            std::fs::write(port.join(i.to_string()), g).unwrap();
        }
        t
    }

    #[test]
    fn device_checks_give_evidence() {
        let empty = tempfile::tempdir().unwrap();
        let p = Params::parse(&json!({})).unwrap();
        let why = check_device(empty.path(), &p).unwrap_err();
        assert!(why.contains("class/infiniband is absent"), "{why}");
        std::fs::create_dir_all(empty.path().join("class/infiniband")).unwrap();
        assert!(
            check_device(empty.path(), &p)
                .unwrap_err()
                .contains("is empty")
        );

        let s = sysfs_with(
            "mlx5_0",
            Some((3, "0000:0000:0000:0000:0000:ffff:1a2d:d1f2")),
        );
        assert_eq!(check_device(s.path(), &p).unwrap(), "mlx5_0");
        let p3 = Params::parse(&json!({"gid_index": 3})).unwrap();
        assert_eq!(check_device(s.path(), &p3).unwrap(), "mlx5_0");
        let why = check_device(
            s.path(),
            &Params::parse(&json!({"device": "mlx5_7"})).unwrap(),
        )
        .unwrap_err();
        assert!(
            why.contains("mlx5_7 is not among the RDMA devices (mlx5_0)"),
            "{why}"
        );
        assert!(
            check_device(s.path(), &Params::parse(&json!({"gid_index": 4})).unwrap())
                .unwrap_err()
                .contains("unreadable")
        );
        assert!(
            check_device(s.path(), &Params::parse(&json!({"ib_port": 2})).unwrap())
                .unwrap_err()
                .contains("no port 2")
        );
        let z = sysfs_with(
            "mlx5_0",
            Some((0, "0000:0000:0000:0000:0000:0000:0000:0000")),
        );
        assert!(
            check_device(z.path(), &Params::parse(&json!({"gid_index": 0})).unwrap())
                .unwrap_err()
                .contains("is empty")
        );
    }

    #[test]
    fn header_names_the_path() {
        // perftest's header as printed by ib_send_bw (github.com/NVIDIA/nccl/issues/1323).
        let text = " Dual-port       : OFF\t\tDevice         : mlx5_0\n\
                    \x20Number of qps   : 1\t\tTransport type : IB\n\
                    \x20Connection type : RC\t\tUsing SRQ      : OFF\n\
                    \x20Mtu             : 4096[B]\n\
                    \x20Link type       : IB\n\
                    \x20GID index       : 3\n";
        let ev = parse_header(text, 1);
        assert_eq!(ev.device.as_deref(), Some("mlx5_0"));
        assert_eq!(ev.transport.as_deref(), Some("IB"));
        assert_eq!(ev.link_layer.as_deref(), Some("IB"));
        assert_eq!(
            (ev.mtu, ev.gid_index, ev.port),
            (Some(4096), Some(3), Some(1))
        );
        assert_eq!(parse_header("", 2).device, None);
    }

    #[test]
    fn params_and_args() {
        let p = Params::parse(&json!({"test": "ib_read_lat", "device": "mlx5_1", "gid_index": 3, "size": 8, "iters": 1000})).unwrap();
        assert_eq!(
            p.args("mlx5_1").join(" "),
            "-d mlx5_1 -i 1 -p 18515 -x 3 -s 8 -n 1000"
        );
        assert_eq!(
            Params::parse(&json!({})).unwrap().args("m").last().unwrap(),
            "-a"
        );
        for bad in [
            json!({"test": "rm"}),
            json!({"device": "../x"}),
            json!({"ib_port": 3}),
            json!({"gid_index": 999}),
        ] {
            assert!(Params::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn perftest_without_devices_is_an_error_that_quotes_it() {
        // What Debian's ib_write_bw 4.5 prints on a machine without an HCA (captured here).
        let text = " Did not detect devices \n If device exists, check if driver is up\n Unable to find the Infiniband/RoCE device\n";
        let err = parse_perftest(text).unwrap_err();
        assert!(err.contains("Did not detect devices"), "{err}");
    }
    #[test]
    fn perftest_tables_by_column_name() {
        // Laid out with perftest's own result formats (bandwidth with MsgRate, and the
        // latency header that runs "#bytes #iterations" together); no HCA was available
        // to capture a real run.
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n\
                  \x20 2          5000             0.00               10.43                5.467546\n\
                  \x20 65536      5000             4555.12            4554.89              0.072878\n\
                  ---------------------------------------------------------------------------------------\n";
        let rows = parse_perftest(bw).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[1].bytes, rows[1].iterations), (65536, 5000));
        assert_eq!(rows[1].get("BW average"), Some(4554.89));
        let r = row("ib_write_bw", &rows[1]);
        assert!((r.algbw_gbs.unwrap() - 4554.89 * 1_048_576.0 / 1e9).abs() < 1e-9);
        assert_eq!(r.extra["MsgRate[Mpps]"], 0.072878);
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]\n\
                   \x20 2       1000          0.80           3.10         0.84               0.85           0.05\n";
        let rows = parse_perftest(lat).unwrap();
        assert_eq!(rows[0].columns.len(), 5);
        assert_eq!(row("ib_read_lat", &rows[0]).time_us, Some(0.85));
        let gbit = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536 1000 97.1 96.0 0.18\n";
        assert_eq!(
            row("ib_send_bw", &parse_perftest(gbit).unwrap()[0]).algbw_gbs,
            Some(12.0)
        );
    }
}
