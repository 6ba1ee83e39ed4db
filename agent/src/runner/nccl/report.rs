//! nccl-tests' output around the table (2.19.6): the preamble (`# nThread …`, `# Using
//! devices` with one line per rank), the closing lines, and the document of its `-J FILE`
//! option (JSON format version 3), so that scripts written for `all_reduce_perf` read
//! ours. What nccl-tests cannot say (the budget, a figure's spread, where the time went) is
//! added as further `#` lines and as extra keys, never in place of theirs.

use heddle_types::jobs::ResultRow;
use serde_json::{Map, Value, json};

use super::Params;
use super::gpu::DeviceInfo;
use super::timing;

/// The nccl-tests release whose output format this follows.
pub const NCCL_TESTS_FORMAT: &str = "2.19.6";
/// nccl-tests' JSON format version.
pub const JSON_VERSION: u32 = 3;

/// One rank driven by this process, for the "Using devices" lines.
#[derive(Debug, Clone, PartialEq)]
pub struct RankLine {
    pub rank: usize,
    pub pid: u32,
    pub host: String,
    pub dev: DeviceInfo,
}

impl RankLine {
    /// `#  Rank  0 Group  0 Pid   1229 on         vm device  0 [0000:00:06] NVIDIA H100 80GB HBM3`
    pub fn line(&self) -> String {
        format!(
            "#  Rank {:2} Group {:2} Pid {:6} on {:>10} device {:2} [{}] {}",
            self.rank, 0, self.pid, self.host, self.dev.device, self.dev.bus_id, self.dev.name
        )
    }
}

/// nccl-tests' program name for a collective (`all_reduce_perf`).
pub fn program(p: &Params) -> String {
    format!("{}_perf", p.coll.name())
}

fn step(p: &Params) -> String {
    match p.sweep.step_bytes {
        Some(b) => format!("{b}(bytes)"),
        None => format!("{}(factor)", p.sweep.factor),
    }
}

/// The lines before the table's column headers.
pub fn preamble(p: &Params, nccl_version: i32, ranks: &[RankLine]) -> String {
    let mut out = format!(
        "# heddle-agent {} bench nccl (nccl-tests {NCCL_TESTS_FORMAT} format) nccl-library={nccl_version}\n",
        env!("CARGO_PKG_VERSION")
    );
    out += &format!("# Collective test starting: {}\n", program(p));
    out += &format!(
        "# nThread 1 nGpus {} minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} agg iters: 1 validation: {} graph: {} unalign: 0\n",
        p.gpus,
        p.sweep.min_bytes,
        p.sweep.max_bytes,
        step(p),
        p.warmup,
        p.iters,
        u8::from(p.check),
        p.graph.unwrap_or(1)
    );
    if p.graph.is_none() {
        out += &format!(
            "# CUDA graphs: sizes up to {} B replayed once from a graph of {} launches, larger sizes launched one by one (-G 0: every size launched, as nccl-tests by default)\n",
            timing::GRAPH_MAX_BYTES,
            p.iters
        );
    }
    if let Some(b) = p.budget {
        out += &format!(
            "# Budget: {:.3} s for the sweep; each size sampled until the 95% interval of its mean is within {}% (at least {} samples of {} iterations); time is the median sample\n",
            b.as_secs_f64(),
            timing::TARGET_CI * 100.0,
            timing::MIN_SAMPLES,
            p.iters,
        );
    }
    out += "#\n# Using devices\n";
    for r in ranks {
        out += &r.line();
        out.push('\n');
    }
    out += "#";
    out
}

/// A trailing comment with the spread of an adaptive row pair (after the `#wrong` column,
/// so parsers that split on blanks still find every column where they expect it).
pub fn spread_note(oop: &ResultRow, ip: Option<&ResultRow>) -> String {
    let one = |r: &ResultRow| -> Option<String> {
        let s = r.extra.get("spread")?;
        Some(format!(
            "±{:.2}% n={}",
            s["rsd_pct"].as_f64()?,
            s["samples"].as_u64()?
        ))
    };
    match (one(oop), ip.and_then(one)) {
        (None, None) => String::new(),
        (a, b) => format!(
            "  # spread {} | {}",
            a.unwrap_or_else(|| "-".into()),
            b.unwrap_or_else(|| "-".into())
        ),
    }
}

/// The closing lines: nccl-tests' two figures, its last line and its closing `#`, with
/// where the time went just before that `#`.
pub fn footer(p: &Params, rows: &[ResultRow], summary: &Map<String, Value>) -> String {
    let mut out = super::table::closing(rows);
    out += &format!("#\n# Collective test concluded: {}\n", program(p));
    let secs = |k: &str| summary.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    out += &format!(
        "# Time: start-up {:.3} s (NCCL init {:.3} s), first row {:.4} s after it, sweep {:.3} s\n#\n",
        secs("init_s"),
        secs("nccl_init_s"),
        secs("first_row_s"),
        secs("sweep_s")
    );
    out
}

fn half(r: &ResultRow) -> Value {
    let mut v = json!({
        "time": r.time_us.unwrap_or(0.0),
        "alg_bw": r.algbw_gbs.unwrap_or(0.0),
        "bus_bw": r.busbw_gbs.unwrap_or(0.0),
        "nwrong": r.wrong.map(|w| w as f64),
    });
    if let Some(s) = r.extra.get("spread") {
        v["spread"] = s.clone();
    }
    if r.extra.get("graph").is_some() {
        v["graph"] = true.into();
    }
    v
}

/// Everything nccl-tests' `-J` writes, for rows in emission order.
pub struct JsonRun<'a> {
    pub args: &'a [String],
    pub env: Vec<String>,
    pub nccl_version: i32,
    pub start_time: String,
    pub end_time: String,
    pub params: &'a Params,
    pub ranks: &'a [RankLine],
    pub rows: &'a [ResultRow],
    pub summary: &'a Map<String, Value>,
}

/// Which environment variables go into the document: NCCL's and CUDA's own, and ours
/// about NCCL. nccl-tests writes all of them; credentials in others must not leak into a
/// results file.
pub fn env_for_json() -> Vec<String> {
    std::env::vars()
        .filter(|(k, _)| {
            ["NCCL_", "CUDA_", "HEDDLE_NCCL_"]
                .iter()
                .any(|p| k.starts_with(p))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

impl JsonRun<'_> {
    pub fn document(&self) -> Value {
        let p = self.params;
        let mut config = json!({
            "nthreads": 1,
            "ngpus": p.gpus,
            "minimum_bytes": p.sweep.min_bytes,
            "maximum_bytes": p.sweep.max_bytes,
            "warmup_iters": p.warmup,
            "iterations": p.iters,
            "aggregated_iterations": 1,
            "validation": u8::from(p.check),
            "graph": p.graph,
            "blocking_collectives": "false",
            "per_iter_timing": "false",
            "per_iter_skip": 0,
            "parallel_init": "false",
            "devices": self.ranks.iter().map(|r| json!({
                "rank": r.rank,
                "group": 0,
                "pid": r.pid,
                "hostname": r.host,
                "device": r.dev.device,
                "device_hex": r.dev.bus_id,
                "device_info": r.dev.name,
            })).collect::<Vec<_>>(),
        });
        match p.sweep.step_bytes {
            Some(b) => config["step_bytes"] = b.into(),
            None => config["step_factor"] = p.sweep.factor.into(),
        }
        if let Some(b) = p.budget {
            config["budget_s"] = b.as_secs_f64().into();
        }
        let mut results = Vec::new();
        let mut i = 0;
        while i < self.rows.len() {
            let oop = &self.rows[i];
            let ip = self
                .rows
                .get(i + 1)
                .filter(|r| r.in_place == Some(true) && r.size_bytes == oop.size_bytes);
            i += 1 + usize::from(ip.is_some());
            let iters = oop
                .extra
                .pointer("/spread/timed_iters")
                .and_then(Value::as_u64)
                .unwrap_or(p.iters * timing::replays(p.graph, oop.size_bytes as u64).max(1));
            results.push(json!({
                "size": oop.size_bytes,
                "count": oop.count,
                "type": oop.dtype,
                "redop": oop.extra.get("redop").cloned().unwrap_or(Value::Null),
                "root": format!("{:6}", oop.root.unwrap_or(-1)),
                "out_of_place": half(oop),
                "in_place": ip.map(half),
                "actual_iterations": iters,
                "experiment_name": "",
            }));
        }
        let wrong: i64 = self.rows.iter().filter_map(|r| r.wrong).sum();
        let busbw: Vec<f64> = self.rows.iter().filter_map(|r| r.busbw_gbs).collect();
        json!({
            "version": JSON_VERSION,
            "start_time": self.start_time,
            "args": self.args,
            "env": self.env,
            "nccl_version": self.nccl_version,
            "config": config,
            "results": results,
            "out_of_bounds": {"count": wrong, "okay": if wrong == 0 { "true" } else { "false" }},
            "average_bus_bandwidth": {
                "bandwidth": busbw.iter().sum::<f64>() / busbw.len().max(1) as f64,
                "okay": "unchecked",
            },
            "errors": [],
            "heddle": self.summary,
            "end_time": self.end_time,
        })
    }
}

/// Creates `path`, or like nccl-tests `path.0`, `path.1`, … when it exists, and says
/// where it wrote.
pub fn write_new(path: &std::path::Path, text: &str) -> std::io::Result<std::path::PathBuf> {
    use std::io::Write;
    let mut candidate = path.to_path_buf();
    for n in 0.. {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(mut f) => {
                f.write_all(text.as_bytes())?;
                return Ok(candidate);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                let mut name = path.as_os_str().to_owned();
                name.push(format!(".{n}"));
                candidate = name.into();
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
