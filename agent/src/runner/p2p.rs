//! `p2p`: copy bandwidth between the GPUs of one node and between each GPU and the host,
//! through the CUDA driver (cudarc), like CUDA's `p2pBandwidthLatencyTest` and
//! `bandwidthTest` but from the agent itself.
//!
//! Measured: every ordered GPU pair (direct when `cuDeviceCanAccessPeer` allows and peer
//! access is enabled, else staged by the driver through host memory), a device-local copy
//! on each GPU, and host→device / device→host per GPU with pinned host memory; optionally
//! both directions of each pair at once.
//!
//! Params: `size` (bytes per copy, default 256 MiB, at most 16 GiB), `warmup` (default 5),
//! `iters` (default 20), `bidirectional` (default false), `gpus` (device indices, default
//! all).

pub mod gpu;

use std::collections::BTreeMap;

use heddle_types::jobs::ResultRow;
use serde_json::{Map, Value, json};

use super::protocol::{ChildEvent, ChildInput};
use heddle_types::kinds::p2p::P2pParams;
use heddle_types::params::KindParams;

use super::{RunError, Sink};

pub const MAX_SIZE: u64 = 16 << 30;
const MAX_ITERS: u64 = 100_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub size: u64,
    pub warmup: u64,
    pub iters: u64,
    pub bidirectional: bool,
    pub gpus: Option<Vec<usize>>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            size: 256 << 20,
            warmup: 5,
            iters: 20,
            bidirectional: false,
            gpus: None,
        }
    }
}

impl Params {
    /// Decodes a job's params through the wire type the server checked them with.
    pub fn from_json(p: &Value) -> Result<Params, RunError> {
        let t = P2pParams::decode(p).map_err(|e| RunError::Params(e.to_string()))?;
        let params = Params {
            size: t.size,
            warmup: t.warmup,
            iters: t.iters,
            bidirectional: t.bidirectional,
            gpus: t.gpus.map(|g| g.into_iter().map(|d| d as usize).collect()),
        };
        params.validate().map_err(RunError::Params)?;
        Ok(params)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.size == 0 || self.size > MAX_SIZE {
            return Err(format!("size must be in 1..={MAX_SIZE}, got {}", self.size));
        }
        if self.iters == 0 || self.iters > MAX_ITERS {
            return Err(format!(
                "iters must be in 1..={MAX_ITERS}, got {}",
                self.iters
            ));
        }
        if self.warmup > MAX_ITERS {
            return Err(format!(
                "warmup must be at most {MAX_ITERS}, got {}",
                self.warmup
            ));
        }
        if let Some(g) = &self.gpus {
            if g.is_empty() {
                return Err("gpus must not be empty".into());
            }
            let mut sorted = g.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != g.len() {
                return Err(format!("gpus lists a device twice: {g:?}"));
            }
        }
        Ok(())
    }

    /// The devices measured: those asked for (all must exist) or all of them.
    pub fn devices(&self, count: usize) -> Result<Vec<usize>, String> {
        match &self.gpus {
            None => Ok((0..count).collect()),
            Some(g) => match g.iter().find(|&&d| d >= count) {
                Some(bad) => Err(format!(
                    "GPU {bad} requested but this node has {count} CUDA device(s)"
                )),
                None => Ok(g.clone()),
            },
        }
    }
}

/// How a copy's bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Copy engine reads or writes the peer's memory directly (NVLink or PCIe P2P).
    P2p,
    /// Peer access is not possible: the driver stages through host memory.
    Staged,
    /// Source and destination on the same GPU.
    Local,
    /// Between a GPU and page-locked host memory.
    Pinned,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::P2p => "p2p",
            Path::Staged => "staged",
            Path::Local => "local",
            Path::Pinned => "pinned",
        }
    }
}

/// GB/s (10⁹ bytes per second) for `bytes` moved in `time_us`.
pub fn gbs(bytes: u64, time_us: f64) -> f64 {
    if time_us > 0.0 {
        bytes as f64 / time_us / 1e3
    } else {
        0.0
    }
}

/// What one row measured: `src`/`dst` are device indices or "host", `kind` d2d, h2d or d2h.
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    pub src: &'a str,
    pub dst: &'a str,
    pub kind: &'a str,
    pub path: Path,
    /// Both directions at once: the row counts the bytes of both.
    pub bidir: bool,
}

/// One measurement; `bytes` is what moved per iteration (twice the size when bidirectional).
pub fn row(size: u64, c: Transfer<'_>, time_us: f64, wrong: u64) -> ResultRow {
    let Transfer {
        src,
        dst,
        kind,
        path,
        bidir,
    } = c;
    let bytes = if bidir { 2 * size } else { size };
    let mut labels = BTreeMap::from([
        ("src".to_string(), src.to_string()),
        ("dst".to_string(), dst.to_string()),
        ("kind".to_string(), kind.to_string()),
        ("path".to_string(), path.name().to_string()),
    ]);
    if bidir {
        labels.insert("mode".into(), "bidir".into());
    }
    ResultRow {
        size_bytes: size as i64,
        count: Some(size as i64),
        dtype: Some("uint8".into()),
        op: Some(kind.into()),
        root: None,
        in_place: Some(false),
        time_us: Some(time_us),
        algbw_gbs: Some(gbs(bytes, time_us)),
        busbw_gbs: None,
        wrong: Some(wrong as i64),
        labels,
        extra: json!({"bytes_moved": bytes}),
    }
}

/// The matrices and host tables of a result, from its rows: `d2d_gbs[i][j]` is the copy
/// from the i-th to the j-th GPU listed in `gpus` (null where not measured).
pub fn summarize(rows: &[ResultRow], gpus: &[usize]) -> Map<String, Value> {
    let pos = |s: Option<&String>| {
        s.and_then(|s| s.parse::<usize>().ok())
            .and_then(|d| gpus.iter().position(|&g| g == d))
    };
    let n = gpus.len();
    let mut uni = vec![vec![Value::Null; n]; n];
    let mut bi = vec![vec![Value::Null; n]; n];
    let mut paths = vec![vec![Value::Null; n]; n];
    let (mut h2d, mut d2h) = (vec![Value::Null; n], vec![Value::Null; n]);
    let mut any_bidir = false;
    for r in rows {
        let (s, d) = (pos(r.labels.get("src")), pos(r.labels.get("dst")));
        let bw = r.algbw_gbs.map_or(Value::Null, |x| json!(x));
        match (r.labels.get("kind").map(String::as_str), s, d) {
            (Some("d2d"), Some(s), Some(d))
                if r.labels.get("mode").is_some_and(|m| m == "bidir") =>
            {
                any_bidir = true;
                bi[s][d] = bw;
            }
            (Some("d2d"), Some(s), Some(d)) => {
                uni[s][d] = bw;
                paths[s][d] = r.labels.get("path").map_or(Value::Null, |p| json!(p));
            }
            (Some("h2d"), _, Some(d)) => h2d[d] = bw,
            (Some("d2h"), Some(s), _) => d2h[s] = bw,
            _ => {}
        }
    }
    let mut m = Map::new();
    m.insert("d2d_gbs".into(), json!(uni));
    m.insert("d2d_paths".into(), json!(paths));
    if any_bidir {
        m.insert("d2d_bidir_gbs".into(), json!(bi));
    }
    m.insert("h2d_gbs".into(), json!(h2d));
    m.insert("d2h_gbs".into(), json!(d2h));
    m.insert(
        "wrong".into(),
        json!(rows.iter().filter_map(|r| r.wrong).sum::<i64>()),
    );
    m
}

fn cell(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| format!("{:>9}", "-"), |x| format!("{x:>9.2}"))
}

/// The bench command's tables: the matrix (rows src, columns dst, GB/s) with the path of
/// each pair, the bidirectional matrix when measured, and the host copies.
pub fn render(summary: &Map<String, Value>) -> String {
    use std::fmt::Write;
    let gpus: Vec<i64> = summary["gpus"]
        .as_array()
        .map(|a| a.iter().filter_map(|g| g["index"].as_i64()).collect())
        .unwrap_or_default();
    let mut s = String::new();
    let header = |s: &mut String| {
        let _ = write!(s, "{:>6}", "src\\dst");
        for g in &gpus {
            let _ = write!(s, "{:>9}", format!("GPU{g}"));
        }
        s.push('\n');
    };
    let matrix = |s: &mut String, key: &str, paths: bool| {
        header(s);
        for (i, g) in gpus.iter().enumerate() {
            let _ = write!(s, "{:>7}", format!("GPU{g}"));
            for j in 0..gpus.len() {
                let v = &summary[key][i][j];
                let tag = if paths {
                    summary["d2d_paths"][i][j].as_str().map_or(" ", |p| &p[..1])
                } else {
                    ""
                };
                let _ = write!(s, "{}{tag}", cell(v));
            }
            s.push('\n');
        }
    };
    let _ = writeln!(
        s,
        "Unidirectional copy bandwidth (GB/s, rows src, columns dst; l local, p direct peer, s staged through host)"
    );
    matrix(&mut s, "d2d_gbs", true);
    if summary.contains_key("d2d_bidir_gbs") {
        let _ = writeln!(
            s,
            "\nBidirectional copy bandwidth (GB/s, both directions together)"
        );
        matrix(&mut s, "d2d_bidir_gbs", false);
    }
    let _ = writeln!(s, "\nHost copies, pinned memory (GB/s)");
    let _ = writeln!(s, "{:>7}{:>9}{:>9}", "GPU", "h2d", "d2h");
    for (i, g) in gpus.iter().enumerate() {
        let _ = writeln!(
            s,
            "{:>7}{}{}",
            format!("GPU{g}"),
            cell(&summary["h2d_gbs"][i]),
            cell(&summary["d2h_gbs"][i])
        );
    }
    s
}

/// Runs every measurement on a node where [`gpu::probe`] found `count` devices; `on_row`
/// sees each row as it is measured. Returns the summary.
pub fn execute(
    p: &Params,
    count: usize,
    on_row: &mut dyn FnMut(&ResultRow, usize, usize) -> std::io::Result<()>,
) -> Result<Map<String, Value>, RunError> {
    let devices = p.devices(count).map_err(RunError::Params)?;
    let failed = |e: gpu::GpuError| RunError::Failed {
        code: 1,
        message: e.to_string(),
    };
    let size = usize::try_from(p.size)
        .map_err(|_| RunError::Params("size does not fit this machine".into()))?;
    let mut bench = gpu::Bench::new(&devices, size, p.warmup, p.iters).map_err(failed)?;
    let n = devices.len();
    let total = n * n + if p.bidirectional { n * (n - 1) / 2 } else { 0 } + 2 * n;
    let mut rows = Vec::with_capacity(total);
    let mut push = |r: ResultRow, rows: &mut Vec<ResultRow>| -> Result<(), RunError> {
        on_row(&r, rows.len() + 1, total)?;
        rows.push(r);
        Ok(())
    };
    for s in 0..n {
        for d in 0..n {
            let (us, wrong) = bench.copy(s, d).map_err(failed)?;
            let c = Transfer {
                src: &devices[s].to_string(),
                dst: &devices[d].to_string(),
                kind: "d2d",
                path: bench.path(s, d),
                bidir: false,
            };
            let r = row(p.size, c, us, wrong);
            push(r, &mut rows)?;
        }
    }
    if p.bidirectional {
        for s in 0..n {
            for d in s + 1..n {
                let (us, wrong_sd, wrong_ds) = bench.copy_bidir(s, d).map_err(failed)?;
                for (a, b, wrong) in [(s, d, wrong_sd), (d, s, wrong_ds)] {
                    let c = Transfer {
                        src: &devices[a].to_string(),
                        dst: &devices[b].to_string(),
                        kind: "d2d",
                        path: bench.path(a, b),
                        bidir: true,
                    };
                    let r = row(p.size, c, us, wrong);
                    push(r, &mut rows)?;
                }
            }
        }
    }
    for (i, dev) in devices.iter().map(ToString::to_string).enumerate() {
        let (us, wrong) = bench.h2d(i).map_err(failed)?;
        push(
            row(
                p.size,
                Transfer {
                    src: "host",
                    dst: &dev,
                    kind: "h2d",
                    path: Path::Pinned,
                    bidir: false,
                },
                us,
                wrong,
            ),
            &mut rows,
        )?;
        let (us, wrong) = bench.d2h(i).map_err(failed)?;
        push(
            row(
                p.size,
                Transfer {
                    src: &dev,
                    dst: "host",
                    kind: "d2h",
                    path: Path::Pinned,
                    bidir: false,
                },
                us,
                wrong,
            ),
            &mut rows,
        )?;
    }
    let mut summary = summarize(&rows, &devices);
    summary.insert("kind".into(), "p2p".into());
    summary.insert("size_bytes".into(), p.size.into());
    summary.insert("warmup".into(), p.warmup.into());
    summary.insert("iters".into(), p.iters.into());
    summary.insert("bidirectional".into(), p.bidirectional.into());
    summary.insert(
        "cuda_driver_version".into(),
        gpu::driver_version().map_or(Value::Null, Value::from),
    );
    summary.insert(
        "gpus".into(),
        Value::Array(
            bench
                .gpus
                .iter()
                .map(|g| json!({"index": g.index, "name": g.name, "pci_bus_id": g.pci_bus_id}))
                .collect(),
        ),
    );
    summary.insert("peer_access".into(), json!(bench.access));
    Ok(summary)
}

pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = Params::from_json(&input.params)?;
    let count = gpu::probe().map_err(RunError::Skip)?;
    let mut on_row = |r: &ResultRow, i: usize, n: usize| -> std::io::Result<()> {
        out.row(r.clone())?;
        let l = &r.labels;
        out.progress(
            Some(i as f64 / n as f64),
            format!(
                "{} {} -> {}: {:.2} GB/s",
                l["kind"],
                l["src"],
                l["dst"],
                r.algbw_gbs.unwrap_or(0.0)
            ),
        )
    };
    let summary = execute(&params, count, &mut on_row)?;
    let wrong = summary["wrong"].as_i64().unwrap_or(0);
    out.emit(&ChildEvent::Summary { summary })?;
    if wrong > 0 {
        return Err(RunError::Failed {
            code: 1,
            message: format!("{wrong} bytes differ after the copies"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
