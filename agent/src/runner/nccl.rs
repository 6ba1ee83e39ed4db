//! `nccl`: NCCL collectives measured the way nccl-tests measures them (same sizes, same
//! counts, same algbw/busbw arithmetic, same validation idea), but from the agent itself
//! through cudarc, so a node needs no nccl-tests build, no MPI and no compiler.
//!
//! Params: `op` (all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall,
//! sendrecv; default all_reduce), `dtype` (default float), `redop` (default sum), `root`
//! (default 0), `min_bytes` (8), `max_bytes` (128 MiB, at most 16 GiB), `factor` (2) or
//! `step_bytes`, `warmup` (5), `iters` (20), `gpus` per node (1), `check` (true), `graph`
//! (CUDA graph replays per sample, nccl-tests' `-G`; 0 launches one by one; unset: sizes
//! up to 1 MiB replayed once from a graph, larger ones launched), `budget` (e.g. `"10s"`: time each
//! size until its figure is stable, within that budget for the sweep; see `timing.rs`).
//!
//! A multi-node job gets rank and world size from its lease; each node holds `gpus`
//! consecutive NCCL ranks, and rank 0 hands NCCL's unique id to the others through the
//! server's rendezvous.

pub mod check;
pub mod debug;
pub mod engine;
pub mod evidence;
pub mod gpu;
pub mod loader;
pub mod params;
pub mod rendezvous;
pub mod report;
pub mod spec;
pub mod table;
pub mod timing;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use heddle_types::jobs::ResultRow;
use serde_json::{Map, Value, json};

use super::protocol::{ChildEvent, ChildInput};
use super::{RunError, Sink};
use engine::{Engine, Topology};
pub use params::{MAX_BUDGET, MAX_BYTES_LIMIT, Params, parse_budget};
use rendezvous::Rendezvous;

/// How long non-zero ranks wait for rank 0's id (rank 0 may still be starting).
pub const RENDEZVOUS_WAIT: Duration = Duration::from_secs(120);

/// Where this process sits among the ranks, and how it meets the others.
#[derive(Debug, Clone)]
pub struct Placement {
    pub topology: Topology,
    pub rendezvous: Option<Rendezvous>,
}

pub fn row(
    p: &Params,
    c: &spec::Counts,
    nranks: usize,
    in_place: bool,
    t: timing::Timing,
) -> ResultRow {
    let (algbw, busbw) = spec::bandwidths(p.coll, c.bytes, t.time_us, nranks);
    let mut extra = json!({
        "redop": if p.coll.prints_redop() { p.redop.name() } else { "none" },
        "nranks": nranks,
    });
    if t.graph {
        extra["graph"] = true.into();
    }
    if let Some(s) = t.spread {
        extra["spread"] = json!(s);
    }
    ResultRow {
        size_bytes: c.bytes as i64,
        // nccl-tests' count column: the count passed to NCCL, per rank for all_gather,
        // reduce_scatter and alltoall (its `paramcount`).
        count: Some(c.param as i64),
        dtype: Some(p.dtype.name().into()),
        op: Some(p.coll.name().into()),
        root: Some(if p.coll.rooted() { p.root as i32 } else { -1 }),
        in_place: Some(in_place),
        time_us: Some(t.time_us),
        algbw_gbs: Some(algbw),
        busbw_gbs: Some(busbw),
        wrong: t.wrong.map(|w| w as i64),
        labels: Default::default(),
        extra,
    }
}

/// The row of a size that moves nothing (nccl-tests prints it; NCCL returns at once for a
/// count of 0): nothing is launched, so nothing took time and nothing can be wrong.
pub fn empty_row(p: &Params, c: &spec::Counts, nranks: usize, in_place: bool) -> ResultRow {
    let mut r = row(
        p,
        c,
        nranks,
        in_place,
        timing::Timing {
            time_us: 0.0,
            wrong: (p.check && (!in_place || p.coll.checked_in_place())).then_some(0),
            graph: false,
            spread: None,
        },
    );
    r.algbw_gbs = Some(0.0);
    r.busbw_gbs = Some(0.0);
    r.extra["empty"] = true.into();
    r
}

/// NCCL subsystems whose INFO lines are the transport evidence (`evidence.rs`).
pub const EVIDENCE_SUBSYS: &[&str] = &["INIT", "NET", "GRAPH", "ENV"];

/// `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS` that log the evidence while keeping what the run's
/// environment asked for: a level below INFO is raised to INFO (its warnings are still in
/// the log), TRACE stays; a subsystem list gains the evidence subsystems, and an exclusion
/// list (`^...`) loses them.
pub fn debug_settings(level: Option<&str>, subsys: Option<&str>) -> (String, String) {
    let level = match level.map(str::trim) {
        Some(l) if l.eq_ignore_ascii_case("TRACE") || l.eq_ignore_ascii_case("INFO") => {
            l.to_ascii_uppercase()
        }
        _ => "INFO".to_string(),
    };
    let subsys = match subsys.map(str::trim).filter(|s| !s.is_empty()) {
        None => {
            let mut all = vec!["BOOTSTRAP"];
            all.extend_from_slice(EVIDENCE_SUBSYS);
            all.join(",")
        }
        Some(s) if s.starts_with('^') => {
            let kept: Vec<&str> = s[1..]
                .split(',')
                .map(str::trim)
                .filter(|x| {
                    !x.is_empty() && !EVIDENCE_SUBSYS.iter().any(|e| e.eq_ignore_ascii_case(x))
                })
                .collect();
            if kept.is_empty() {
                "ALL".to_string()
            } else {
                format!("^{}", kept.join(","))
            }
        }
        Some(s) => {
            let mut parts: Vec<String> = s.split(',').map(|x| x.trim().to_string()).collect();
            let all = parts.iter().any(|p| p.eq_ignore_ascii_case("ALL"));
            for e in EVIDENCE_SUBSYS {
                if !all && !parts.iter().any(|p| p.eq_ignore_ascii_case(e)) {
                    parts.push(e.to_string());
                }
            }
            parts.join(",")
        }
    };
    (level, subsys)
}

/// NCCL's own expansion of `NCCL_DEBUG_FILE`: `%h` the hostname, `%p` the process id;
/// `None` for other `%` forms, which are not read back.
fn expand_debug_file(raw: &str) -> Option<PathBuf> {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let expanded = raw
        .replace("%h", &host)
        .replace("%p", &std::process::id().to_string());
    (!expanded.contains('%')).then(|| PathBuf::from(expanded))
}

/// Sends NCCL's INFO log to a file we read back (never to stdout, which carries our
/// protocol or table), unless the run's environment already chose a file, which is then
/// read and kept. Either way NCCL logs at least the evidence subsystems at INFO. Must run
/// before NCCL is loaded and while the process has one thread.
pub fn prepare_debug_log() -> Option<(PathBuf, bool)> {
    let (level, subsys) = debug_settings(
        std::env::var("NCCL_DEBUG").ok().as_deref(),
        std::env::var("NCCL_DEBUG_SUBSYS").ok().as_deref(),
    );
    // SAFETY: called at the start of the command, before any other thread exists.
    unsafe {
        std::env::set_var("NCCL_DEBUG", level);
        std::env::set_var("NCCL_DEBUG_SUBSYS", subsys);
    }
    if let Some(path) = std::env::var_os("NCCL_DEBUG_FILE") {
        // Ours from a parent process (the shim re-run), or the user's: read, keep.
        let path = expand_debug_file(&path.to_string_lossy())?;
        let ours = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("heddle-nccl-debug-"));
        return Some((path, ours));
    }
    let path = std::env::temp_dir().join(format!(
        "heddle-nccl-debug-{}-{}.log",
        std::process::id(),
        chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
    ));
    // SAFETY: as above.
    unsafe {
        std::env::set_var("NCCL_DEBUG_FILE", &path);
    }
    Some((path, true))
}

/// Runs the whole sweep on a machine where [`loader::probe`] said `Ready`; `on_row` sees
/// every row as soon as it is measured. Returns the summary.
pub fn execute(
    p: &Params,
    place: &Placement,
    on_row: &mut dyn FnMut(&ResultRow, usize, usize) -> std::io::Result<()>,
) -> Result<Map<String, Value>, RunError> {
    let topo = &place.topology;
    let nranks = topo.nranks;
    if p.root >= nranks {
        return Err(RunError::Params(format!(
            "root {} is not a rank (0..{nranks})",
            p.root
        )));
    }
    let plan = p.plan(nranks);
    if plan.is_empty() {
        return Err(RunError::Params(format!(
            "no size in the sweep moves a whole element per rank with {nranks} ranks"
        )));
    }
    let es = p.dtype.size();
    let capacity = plan
        .iter()
        .map(|c| c.send.max(c.recv) * es)
        .max()
        .unwrap_or(0);
    let fail = |e: engine::EngineError| RunError::Failed {
        code: 1,
        message: e.to_string(),
    };
    let version = engine::nccl_version().map_err(fail)?;
    let uid = match &place.rendezvous {
        None => None,
        Some(rv) => {
            let root = topo.first_rank == 0;
            let own = if root {
                Some(engine::new_unique_id().map_err(fail)?)
            } else {
                None
            };
            Some(
                rv.exchange(root, own, RENDEZVOUS_WAIT)
                    .map_err(|m| RunError::Failed {
                        code: 1,
                        message: m,
                    })?,
            )
        }
    };
    let started = Instant::now();
    let engine = Engine::new(topo, uid, capacity).map_err(fail)?;
    let init = started.elapsed();
    let modes: &[bool] = if p.has_in_place() {
        &[false, true]
    } else {
        &[false]
    };
    let case = engine::Case {
        coll: p.coll,
        dtype: p.dtype,
        op: p.redop,
        root: p.root,
    };
    let settings = timing::Settings {
        warmup: p.warmup,
        iters: p.iters,
        graph: p.graph,
        check: p.check,
    };
    let sweep_start = Instant::now();
    let mut first_row = None;
    let total = plan.len() * modes.len();
    let mut rows = Vec::new();
    let steps = p.steps(nranks);
    let mut measured = 0;
    for (i, (c, measure)) in steps.iter().enumerate() {
        for &in_place in modes {
            if !measure {
                let r = empty_row(p, c, nranks, in_place);
                on_row(&r, i, steps.len()).map_err(RunError::Io)?;
                rows.push(r);
                continue;
            }
            let share = p
                .budget
                .map(|b| timing::share(b, sweep_start.elapsed(), total - measured));
            let t = timing::measure(&engine, &case, c, in_place, &settings, share).map_err(fail)?;
            let r = row(p, c, nranks, in_place, t);
            on_row(&r, i, steps.len()).map_err(RunError::Io)?;
            first_row.get_or_insert_with(|| sweep_start.elapsed());
            rows.push(r);
            measured += 1;
        }
    }
    let sweep = sweep_start.elapsed();
    let nccl_init = engine.nccl_init_time();
    // The callers (the bench command, the job's child) exit right after: the driver frees
    // buffers, contexts and NCCL's threads at exit, sooner than destroying the
    // communicators and freeing the buffers one by one (0.16–0.18 s after an 8 GiB sweep on
    // an H100, 0.5 s after a budget run's graphs).
    std::mem::forget(engine);
    let mut s = Map::new();
    s.insert("kind".into(), "nccl".into());
    s.insert("collective".into(), p.coll.name().into());
    s.insert("dtype".into(), p.dtype.name().into());
    s.insert("redop".into(), p.redop.name().into());
    s.insert("nranks".into(), nranks.into());
    s.insert("local_ranks".into(), topo.devices.len().into());
    s.insert("first_rank".into(), topo.first_rank.into());
    s.insert("devices".into(), json!(topo.devices));
    s.insert("nccl_version".into(), version.into());
    s.insert("warmup".into(), p.warmup.into());
    s.insert("iters".into(), p.iters.into());
    s.insert("check".into(), p.check.into());
    s.insert("graph".into(), json!(p.graph));
    if let Some(b) = p.budget {
        s.insert("budget_s".into(), b.as_secs_f64().into());
    }
    // Where the wall time went: contexts, buffers, kernels and communicators (NCCL's part
    // overlaps ours); the first row after them; the whole sweep.
    s.insert("init_s".into(), init.as_secs_f64().into());
    s.insert("nccl_init_s".into(), nccl_init.as_secs_f64().into());
    s.insert(
        "first_row_s".into(),
        first_row.unwrap_or_default().as_secs_f64().into(),
    );
    s.insert("sweep_s".into(), sweep.as_secs_f64().into());
    let wrong: i64 = rows.iter().filter_map(|r| r.wrong).sum();
    s.insert("wrong".into(), wrong.into());
    let busbw: Vec<f64> = rows.iter().filter_map(|r| r.busbw_gbs).collect();
    s.insert(
        "avg_busbw_gbs".into(),
        (busbw.iter().sum::<f64>() / busbw.len().max(1) as f64).into(),
    );
    s.insert(
        "peak_busbw_gbs".into(),
        busbw.iter().cloned().fold(0.0, f64::max).into(),
    );
    let keys: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NCCL_") && k != "NCCL_DEBUG_FILE")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    s.insert("nccl_env".into(), json!(keys));
    Ok(s)
}

/// Adds what NCCL's log said to the summary, and removes the log when it was ours.
pub fn absorb_debug_log(log: Option<(PathBuf, bool)>, s: &mut Map<String, Value>) {
    let Some((path, ours)) = log else { return };
    if let Ok(text) = std::fs::read_to_string(&path) {
        let d = debug::parse(&text);
        s.insert("nccl_transports".into(), json!(d.transports));
        s.insert("nccl_connections".into(), json!(d.connections));
        s.insert("nccl_channels".into(), d.channels.into());
        if let Some(v) = d.version {
            s.insert("nccl_version_line".into(), v.into());
        }
        if let Some(n) = d.network {
            s.insert("nccl_network".into(), n.into());
        }
        if let Some(l) = d.channel_line {
            s.insert("nccl_channel_line".into(), l.into());
        }
        if !d.warnings.is_empty() {
            s.insert("nccl_warnings".into(), json!(d.warnings));
        }
        s.insert("nccl_evidence".into(), json!(evidence::parse(&text)));
    }
    if ours {
        let _ = std::fs::remove_file(&path);
    }
}

/// Bandwidth below which a step counts as stuck rather than slow when the stall watch
/// sizes its allowance: far below any fabric NCCL runs on.
const FLOOR_BYTES_PER_S: f64 = 1e9;

/// The longest one step of this test may take without being stuck: the communicator's
/// set-up (which waits up to [`RENDEZVOUS_WAIT`] for the peers) or the largest size's
/// iterations at [`FLOOR_BYTES_PER_S`], whichever is longer.
pub fn slowest_step(p: &Params, plan: &[spec::Counts]) -> Duration {
    let largest = plan.iter().map(|c| c.bytes).max().unwrap_or(0) as f64;
    let modes = if p.has_in_place() { 2.0 } else { 1.0 };
    let rounds = (p.warmup + p.iters) as f64 * modes;
    Duration::from_secs_f64(largest * rounds / FLOOR_BYTES_PER_S).max(RENDEZVOUS_WAIT)
}

/// The job kind.
pub fn run(input: &ChildInput, out: &mut Sink<'_>) -> Result<(), RunError> {
    let params = Params::from_json(&input.params)?;
    let log = prepare_debug_log();
    match loader::probe() {
        loader::Probe::Ready => {}
        loader::Probe::Unavailable(why) => {
            return Err(RunError::Skip(format!("NCCL unavailable: {why}")));
        }
        loader::Probe::NeedsShim { dir, .. } => {
            // The re-run child reads the same input and writes the events itself.
            let raw = serde_json::to_vec(input).expect("child input serializes");
            let code = loader::rerun_with_shim(dir, Some(&raw))?;
            std::process::exit(code);
        }
    }
    let world = input.world_size.max(1) as usize;
    let rank = input.rank.max(0) as usize;
    let rendezvous = if world > 1 {
        Some(Rendezvous::for_job(input).ok_or_else(|| RunError::Failed {
            code: 1,
            message: format!(
                "a {world}-node NCCL job needs the server rendezvous, but the agent passed none to the test process"
            ),
        })?)
    } else {
        None
    };
    let place = Placement {
        topology: Topology {
            devices: (0..params.gpus).collect(),
            first_rank: rank * params.gpus,
            nranks: world * params.gpus,
        },
        rendezvous,
    };
    let plan = params.plan(place.topology.nranks);
    out.emit(&ChildEvent::Plan {
        sizes_bytes: plan.iter().map(|c| c.bytes as i64).collect(),
        slowest_step_s: slowest_step(&params, &plan).as_secs_f64(),
    })?;
    out.progress(Some(0.0), "setting up the NCCL communicator")?;
    let mut on_row = |r: &ResultRow, i: usize, n: usize| {
        out.row(r.clone())?;
        out.progress(
            Some((i + 1) as f64 / n as f64),
            format!(
                "{} {} B: busbw {:.2} GB/s",
                params.coll,
                r.size_bytes,
                r.busbw_gbs.unwrap_or(0.0)
            ),
        )
    };
    let mut summary = execute(&params, &place, &mut on_row)?;
    absorb_debug_log(log, &mut summary);
    out.emit(&ChildEvent::Summary { summary })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spec::{Collective, Dtype};

    #[test]
    fn debug_settings_keep_the_runs_wishes_and_log_the_evidence() {
        let s = |l: Option<&str>, sub: Option<&str>| debug_settings(l, sub);
        assert_eq!(
            s(None, None),
            ("INFO".into(), "BOOTSTRAP,INIT,NET,GRAPH,ENV".into())
        );
        assert_eq!(s(Some("WARN"), None).0, "INFO");
        assert_eq!(s(Some("trace"), None).0, "TRACE");
        assert_eq!(s(None, Some("COLL,NET")).1, "COLL,NET,INIT,GRAPH,ENV");
        assert_eq!(s(None, Some("ALL")).1, "ALL");
        assert_eq!(s(None, Some("^NET,COLL")).1, "^COLL");
        assert_eq!(s(None, Some("^INIT")).1, "ALL");
    }

    #[test]
    fn rows_carry_the_nccl_tests_columns() {
        let p = Params {
            coll: Collective::Broadcast,
            root: 1,
            dtype: Dtype::Half,
            ..Params::default()
        };
        let c = p.coll.counts(1 << 20, 2, 4);
        let r = row(
            &p,
            &c,
            4,
            true,
            timing::Timing {
                time_us: 100.0,
                wrong: Some(0),
                graph: false,
                spread: None,
            },
        );
        assert_eq!(r.size_bytes, 1 << 20);
        assert_eq!(r.count, Some(1 << 19));
        assert_eq!(r.root, Some(1));
        assert_eq!(r.extra["redop"], "none");
        assert!((r.algbw_gbs.unwrap() - 10.48576).abs() < 1e-9);
        assert_eq!(r.algbw_gbs, r.busbw_gbs);
        let t = timing::Timing {
            time_us: 100.0,
            wrong: Some(0),
            graph: false,
            spread: None,
        };
        // all_gather: the per-rank count, as nccl-tests' count column.
        let p = Params {
            coll: Collective::AllGather,
            ..Params::default()
        };
        let r = row(&p, &p.coll.counts(1024, 4, 2), 2, false, t);
        assert_eq!((r.size_bytes, r.count), (1024, Some(128)));
        assert_eq!(r.extra["redop"], "none");
        // sendrecv prints the op it was given.
        let p = Params {
            coll: Collective::SendRecv,
            ..Params::default()
        };
        let r = row(&p, &p.coll.counts(1024, 4, 2), 2, true, t);
        assert_eq!(
            (r.count, &r.extra["redop"]),
            (Some(256), &serde_json::json!("sum"))
        );
        let e = empty_row(&p, &p.coll.counts(0, 4, 2), 2, false);
        assert_eq!(
            (e.size_bytes, e.count, e.time_us, e.busbw_gbs, e.wrong),
            (0, Some(0), Some(0.0), Some(0.0), Some(0))
        );
    }
}
