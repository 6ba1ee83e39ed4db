//! `heddle-agent bench`: the agent's test runners from a shell, without a server, with
//! nccl-tests' flags and table so results compare line by line with `all_reduce_perf`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use heddle_types::jobs::ResultRow;

use crate::exit::{self, Exit};
use crate::runner::nccl::{
    self, Params, Placement, engine, engine::Topology, loader, rendezvous::Rendezvous, report, spec,
};
use crate::runner::stall::{Hang, Plan, Watchdog};
use crate::runner::{RunError, p2p};

/// `bench nccl` says why it did not pass in its exit status (`crate::exit`): 1 wrong
/// elements (validation failed); 2 bad flags; 3 could not run here (no CUDA driver, no GPU,
/// no NCCL), with the reason; 4 CUDA or NCCL failed during the run; 5 hung: no size
/// finished within the stall limit (a peer stopped, or the ranks disagree on a setting they
/// must share), and the process ended itself so its GPUs are free.
fn exit_with(code: u8, message: impl Into<String>) -> anyhow::Error {
    Exit::new(code, message).into()
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Bench,
}

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// An NCCL collective over a size sweep, printed like nccl-tests.
    Nccl(NcclArgs),
    /// Copy bandwidth between every pair of GPUs and between each GPU and the host.
    P2p(P2pArgs),
}

#[derive(Debug, Args)]
pub struct P2pArgs {
    /// Bytes per copy (K, M, G suffixes are powers of 1024).
    #[arg(short = 's', long, default_value = "256M", value_parser = spec::parse_size)]
    pub size: u64,
    /// Warm-up copies per measurement (not timed).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: u64,
    /// Timed copies per measurement.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u64,
    /// Also copy both ways between each pair at once.
    #[arg(long)]
    pub bidirectional: bool,
    /// Devices to measure, e.g. `0,2`; all by default.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<usize>>,
    /// Print the rows and summary as JSON instead of the tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct NcclArgs {
    /// all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall or sendrecv.
    #[arg(value_parser = |s: &str| s.parse::<spec::Collective>())]
    pub op: spec::Collective,
    /// Smallest size (K, M, G suffixes are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = spec::parse_size)]
    pub min_bytes: u64,
    /// Largest size.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = spec::parse_size)]
    pub max_bytes: u64,
    /// Multiply the size by this between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: u64,
    /// Add this many bytes between steps instead of multiplying.
    #[arg(short = 'i', long = "stepbytes", value_parser = spec::parse_size)]
    pub step_bytes: Option<u64>,
    /// GPUs driven by this process (one NCCL rank each).
    #[arg(short = 'g', long = "ngpus", default_value_t = 1)]
    pub gpus: usize,
    /// Warm-up iterations per size (not timed).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: u64,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u64,
    /// Validate results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Data type.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = |s: &str| s.parse::<spec::Dtype>())]
    pub dtype: spec::Dtype,
    /// Reduction op.
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = |s: &str| s.parse::<spec::RedOp>())]
    pub redop: spec::RedOp,
    /// Root rank of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// Processes taking part (each with `-g` GPUs); more than one needs a rendezvous.
    #[arg(long, default_value_t = 1)]
    pub nprocs: usize,
    /// This process's index among `--nprocs`.
    #[arg(long, default_value_t = 0)]
    pub proc_rank: usize,
    /// First local GPU used; defaults to `proc_rank × g`, right for processes on one host.
    #[arg(long)]
    pub first_device: Option<usize>,
    /// File through which process 0 hands NCCL's id to the others (fresh path per run).
    #[arg(long)]
    pub rendezvous_file: Option<PathBuf>,
    /// Replay the `-n` iterations from a CUDA graph this many times per sample, as
    /// nccl-tests' `-G`; 0 launches them one by one, as nccl-tests does by default.
    /// Without it, sizes up to 1 MiB are replayed once from a graph (launched one by one,
    /// their time is the CPU's launch cost) and larger sizes are launched.
    #[arg(short = 'G', long = "cudagraph")]
    pub graph: Option<u64>,
    /// Sample each size until its figure is stable, the sweep within about this long
    /// (e.g. `10s`, `500ms`, `2m`).
    #[arg(long, value_parser = nccl::parse_budget)]
    pub budget: Option<std::time::Duration>,
    /// Also write nccl-tests' JSON document (format 3) to this file; an existing file is
    /// kept and FILE.0, FILE.1, … are tried instead.
    #[arg(short = 'J', long = "output_file")]
    pub output_file: Option<PathBuf>,
    /// Silence (no size finished) allowed beyond the step's expected time before the
    /// run counts as hung: it then says where it stopped and exits with status 5, freeing
    /// its GPUs. Ranks that disagree on a setting they must share (NCCL_MAX_NCHANNELS,
    /// NCCL_ALGO, ...) wait for each other forever; this is how such a run ends. `0`: never.
    #[arg(long, default_value = "60s", value_parser = heddle_types::duration::parse)]
    pub stall_limit: std::time::Duration,
    /// Print the rows and summary as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn command(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Bench::Nccl(a) => nccl_command(a),
        Bench::P2p(a) => p2p_command(a),
    }
}

fn p2p_command(a: P2pArgs) -> anyhow::Result<()> {
    let params = p2p::Params {
        size: a.size,
        warmup: a.warmup,
        iters: a.iters,
        bidirectional: a.bidirectional,
        gpus: a.gpus,
    };
    params.validate().map_err(anyhow::Error::msg)?;
    let count = match p2p::gpu::probe() {
        Ok(n) => n,
        Err(why) => {
            // Not an error of the command: the node cannot run it, and says why.
            eprintln!("{why}");
            if a.json {
                println!("{}", serde_json::json!({ "skipped": why }));
            }
            return Ok(());
        }
    };
    let mut rows = Vec::new();
    let mut collect = |r: &ResultRow, _: usize, _: usize| {
        rows.push(r.clone());
        Ok(())
    };
    let summary = match p2p::execute(&params, count, &mut collect) {
        Ok(s) => s,
        Err(RunError::Params(why)) => anyhow::bail!("{why}"),
        Err(e) => anyhow::bail!("{e}"),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"summary": summary, "rows": rows}))?
        );
    } else {
        println!(
            "# heddle-agent bench p2p: {} B per copy, warmup {}, iters {}, CUDA driver {}",
            params.size,
            params.warmup,
            params.iters,
            summary["cuda_driver_version"].as_str().unwrap_or("?")
        );
        for g in summary["gpus"].as_array().into_iter().flatten() {
            println!(
                "# GPU{}: {} (PCI bus {})",
                g["index"],
                g["name"].as_str().unwrap_or("?"),
                g["pci_bus_id"]
            );
        }
        print!("{}", p2p::render(&summary));
    }
    let wrong = summary["wrong"].as_i64().unwrap_or(0);
    if wrong > 0 {
        anyhow::bail!("{wrong} bytes differ after the copies");
    }
    Ok(())
}

impl NcclArgs {
    pub fn params(&self) -> Result<Params, String> {
        let p = Params {
            coll: self.op,
            dtype: self.dtype,
            redop: self.redop,
            root: self.root,
            sweep: spec::Sweep {
                min_bytes: self.min_bytes,
                max_bytes: self.max_bytes,
                factor: self.factor,
                step_bytes: self.step_bytes,
            },
            warmup: self.warmup,
            iters: self.iters,
            gpus: self.gpus,
            check: self.check != 0,
            graph: self.graph,
            budget: self.budget,
            // Every size gets its row, as in nccl-tests' table.
            every_size: true,
        };
        p.validate()?;
        Ok(p)
    }

    pub fn placement(&self) -> Result<Placement, String> {
        if self.nprocs == 0 || self.proc_rank >= self.nprocs {
            return Err(format!(
                "--proc-rank {} is not below --nprocs {}",
                self.proc_rank, self.nprocs
            ));
        }
        let rendezvous = match (&self.rendezvous_file, self.nprocs) {
            (_, 1) => None,
            (Some(path), _) => Some(Rendezvous::File(path.clone())),
            (None, n) => return Err(format!("{n} processes need --rendezvous-file")),
        };
        let first = self.first_device.unwrap_or(self.proc_rank * self.gpus);
        Ok(Placement {
            topology: Topology {
                devices: (first..first + self.gpus).collect(),
                first_rank: self.proc_rank * self.gpus,
                nranks: self.nprocs * self.gpus,
            },
            rendezvous,
        })
    }
}

fn nccl_command(a: NcclArgs) -> anyhow::Result<()> {
    let params = a.params().map_err(|e| exit_with(exit::USAGE, e))?;
    let place = a.placement().map_err(|e| exit_with(exit::USAGE, e))?;
    let start_time = chrono::Local::now();
    let log = nccl::prepare_debug_log();
    match loader::probe() {
        loader::Probe::Ready => {}
        loader::Probe::Unavailable(why) => {
            let why = format!("NCCL unavailable: {why}");
            if a.json {
                println!("{}", serde_json::json!({ "skipped": why }));
            }
            return Err(exit_with(exit::UNAVAILABLE, why));
        }
        loader::Probe::NeedsShim { dir, library } => {
            tracing::debug!(library = %library.display(), shim = %dir.display(), "re-running with a libnccl.so link");
            let code = loader::rerun_with_shim(dir, None)?;
            std::process::exit(code);
        }
    }
    let failed = |e: engine::EngineError| exit_with(exit::FAILED, e.to_string());
    let version = engine::nccl_version_code().map_err(failed)?;
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    let ranks: Vec<report::RankLine> = nccl::gpu::describe_devices(&place.topology.devices)
        .map_err(|e| exit_with(exit::FAILED, e))?
        .into_iter()
        .enumerate()
        .map(|(i, dev)| report::RankLine {
            rank: place.topology.first_rank + i,
            pid: std::process::id(),
            host: host.clone(),
            dev,
        })
        .collect();
    if !a.json {
        println!("{}", report::preamble(&params, version, &ranks));
        println!("{}", nccl::table::header());
    }
    let mut pending: Option<ResultRow> = None;
    let json = a.json;
    let has_ip = params.has_in_place();
    let mut on_row = |r: &ResultRow, _: usize, _: usize| -> std::io::Result<()> {
        if json {
            return Ok(());
        }
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if r.in_place == Some(true) {
            let oop = pending.take().unwrap_or_else(|| r.clone());
            let note = report::spread_note(&oop, Some(r));
            writeln!(out, "{}{note}", nccl::table::line(&oop, Some(r)))?;
        } else if has_ip {
            pending = Some(r.clone());
        } else {
            let note = report::spread_note(r, None);
            writeln!(out, "{}{note}", nccl::table::line(r, None))?;
        }
        out.flush()
    };
    let dog = (!a.stall_limit.is_zero()).then(|| {
        let plan = params.plan(place.topology.nranks);
        let plan = Plan {
            sizes_bytes: plan.iter().map(|c| c.bytes as i64).collect(),
            slowest_step: nccl::slowest_step(&params, &plan),
        };
        Watchdog::start(a.stall_limit, plan, move |h| hung(&h, json))
    });
    let mut rows = Vec::new();
    let mut collect = |r: &ResultRow, i: usize, n: usize| {
        rows.push(r.clone());
        if let Some(dog) = &dog {
            dog.row(r.size_bytes);
        }
        on_row(r, i, n)
    };
    let mut summary = match nccl::execute(&params, &place, &mut collect) {
        Ok(s) => s,
        Err(RunError::Skip(why)) => return Err(exit_with(exit::UNAVAILABLE, why)),
        Err(RunError::Params(why)) => return Err(exit_with(exit::USAGE, why)),
        Err(e) => return Err(exit_with(exit::FAILED, e.to_string())),
    };
    drop(dog);
    nccl::absorb_debug_log(log, &mut summary);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"summary": summary, "rows": rows}))?
        );
    } else {
        print!("{}", report::footer(&params, &rows, &summary));
        for key in [
            "nccl_version",
            "nccl_network",
            "nccl_transports",
            "nccl_channels",
            "nccl_channel_line",
        ] {
            if let Some(v) = summary.get(key) {
                println!("# {key}: {v}");
            }
        }
    }
    if let Some(path) = &a.output_file {
        let args: Vec<String> = std::env::args().collect();
        let fmt = "%Y-%m-%d %H:%M:%S";
        let doc = report::JsonRun {
            args: &args,
            env: report::env_for_json(),
            nccl_version: version,
            start_time: start_time.format(fmt).to_string(),
            end_time: chrono::Local::now().format(fmt).to_string(),
            params: &params,
            ranks: &ranks,
            rows: &rows,
            summary: &summary,
        }
        .document();
        let text = serde_json::to_string_pretty(&doc)? + "\n";
        let written = report::write_new(path, &text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        // On stderr with --json, whose stdout is one document.
        if json {
            eprintln!("# Writing JSON output to {}", written.display());
        } else {
            println!("# Writing JSON output to {}", written.display());
        }
    }
    let wrong: i64 = rows.iter().filter_map(|r| r.wrong).sum();
    if wrong > 0 {
        return Err(exit_with(exit::WRONG, format!("{wrong} wrong elements")));
    }
    Ok(())
}

/// The run is stuck: say where, then end the process at once. NCCL's threads and the
/// GPU kernel waiting for a peer cannot be unwound from here, and exit handlers could wait
/// on them; `_exit` lets the driver free the GPUs.
fn hung(h: &Hang, json: bool) {
    let message = format!(
        "hung: no progress for {:.0} s (allowed {:.0} s) at {}; a peer stopped or the ranks \
         disagree on a setting every rank must share (compare their NCCL_* variables); \
         ending this process so its GPUs are free",
        h.silent_for.as_secs_f64(),
        h.limit.as_secs_f64(),
        h.stage
    );
    if json {
        println!(
            "{}",
            serde_json::json!({"hung": {"stage": h.stage, "silent_s": h.silent_for.as_secs(),
                "limit_s": h.limit.as_secs(), "last_size_bytes": h.last_size_bytes}})
        );
    }
    eprintln!("heddle-agent bench: {message}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: _exit only ends the process; nothing of this process runs after it.
    unsafe { libc::_exit(i32::from(exit::HUNG)) }
}
