//! `heddle-profiler-drive`: loads a built profiler plugin and drives it through its C ABI
//! as NCCL 2.28 would, either to simulate a job (so end-to-end tests get spool files the
//! plugin itself wrote) or to measure the plugin's cost per event (`--bench`).

use std::ffi::CString;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use heddle_nccl_profiler::abi::ProfilerV5;
use heddle_nccl_profiler::host::{self, Host, Net, Op, Prepared};

#[derive(Parser, Debug)]
#[command(
    name = "heddle-profiler-drive",
    about = "Drive a Heddle NCCL profiler plugin through its C ABI as NCCL would: simulate one \
             process of a job (one communicator), or measure the plugin's cost per event",
    after_help = "Example: heddle-profiler-drive --lib target/release/libheddle_nccl_profiler.so \
                  --spool /tmp/spool --comm-nranks 2 --nnodes 2 --rank 0 \
                  --op AllReduce:1048576:20 --op Send:4096:3 --net Socket"
)]
struct Args {
    /// The plugin to load (libnccl-profiler-heddle.so).
    #[arg(long, env = "HEDDLE_PROFILER_LIB")]
    lib: PathBuf,
    /// Spool directory the plugin writes to (sets HEDDLE_PROFILER_SPOOL for it). Default:
    /// the plugin's own (/var/spool/heddle/jobs); with --bench, a fresh private temporary
    /// directory.
    #[arg(long, env = "HEDDLE_PROFILER_SPOOL")]
    spool: Option<PathBuf>,
    /// Seconds between the plugin's rewrites (sets HEDDLE_PROFILER_INTERVAL_S).
    #[arg(long, env = "HEDDLE_PROFILER_INTERVAL_S")]
    interval: Option<f64>,
    /// Ranks in the communicator.
    #[arg(long, default_value_t = 2)]
    comm_nranks: i32,
    /// Nodes the communicator spans; with more than one, operations carry proxy traffic
    /// over --net.
    #[arg(long, default_value_t = 1)]
    nnodes: i32,
    /// This process's rank in the communicator.
    #[arg(long, default_value_t = 0)]
    rank: i32,
    /// Communicator hash (hex); by default one derived from the pid.
    #[arg(long)]
    comm_id: Option<String>,
    /// Communicator name as NCCL passes it (ncclConfig_t.commName).
    #[arg(long)]
    comm_name: Option<String>,
    /// An operation to run: FUNC:BYTES:COUNT, e.g. AllReduce:1048576:20 (COUNT operations of
    /// BYTES bytes each). FUNC is NCCL's name: AllReduce, AllGather, ReduceScatter,
    /// Broadcast, Reduce, or Send/Recv (point-to-point). Repeatable; run in order.
    #[arg(long = "op")]
    ops: Vec<String>,
    /// Datatype of the operations (NCCL's name); BYTES must be a multiple of its size.
    #[arg(long, default_value = "ncclFloat32")]
    datatype: String,
    /// Algorithm the simulated NCCL picked (as its descriptors say: RING, TREE, NVLS, ...).
    #[arg(long, default_value = "RING")]
    algo: String,
    /// Protocol the simulated NCCL picked (LL, LL128, SIMPLE).
    #[arg(long, default_value = "SIMPLE")]
    proto: String,
    /// Channels per operation (one kernel channel event each).
    #[arg(long, default_value_t = 4)]
    channels: u8,
    /// Simulated GPU bandwidth in GB/s: each operation's GPU time is BYTES / this.
    #[arg(long, default_value_t = 20.0)]
    gbps: f64,
    /// Network of the proxy traffic when --nnodes > 1: IB, Socket (with network plugin
    /// events), silent (proxy operations only, as NVIDIA's NCCL builds report them), none,
    /// or another net plugin's name (reported under that name through NCCL_NET_PLUGIN).
    #[arg(long, default_value = "IB")]
    net: String,
    /// Exit without finalizing the communicator (as jobs that never destroy it do).
    #[arg(long)]
    no_finalize: bool,
    /// When the first operation starts, in ms since the Unix epoch (several processes
    /// given the same start run the same schedule, as ranks of one job do). Default: now.
    #[arg(long)]
    start_at_ms: Option<u64>,
    /// Operation i starts at the start + i × this (0: one after another at once).
    #[arg(long, default_value_t = 0)]
    period_ms: u64,
    /// Every operation starts this much later than the schedule says (a straggling rank).
    #[arg(long, default_value_t = 0)]
    late_ms: u64,
    /// The last operation never finishes: launched, its kernel channels and proxy
    /// operations started and never stopped (a hung collective).
    #[arg(long)]
    hang_last: bool,
    /// Seconds to stay alive after the operations, before finalizing (or exiting), while
    /// the plugin's writer goes on writing (an idle or hung rank).
    #[arg(long, default_value_t = 0.0)]
    linger_s: f64,
    /// Measure: run this many start+stop pairs (per thread) and print ns per pair as JSON.
    #[arg(long)]
    bench: Option<u64>,
    /// Threads for --bench, each with a communicator of its own.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn parse_op(spec: &str, args: &Args) -> Result<(Op, u64), String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let [func, bytes, count] = parts[..] else {
        return Err(format!("--op {spec}: expected FUNC:BYTES:COUNT"));
    };
    let bytes: u64 = bytes.parse().map_err(|_| format!("--op {spec}: BYTES"))?;
    let count: u64 = count.parse().map_err(|_| format!("--op {spec}: COUNT"))?;
    let size = heddle_nccl_profiler::names::datatype_size(args.datatype.as_bytes());
    if !bytes.is_multiple_of(size) {
        return Err(format!(
            "--op {spec}: {bytes} is not a multiple of {} ({size} bytes)",
            args.datatype
        ));
    }
    let op = Op {
        func: func.to_string(),
        count: (bytes / size) as usize,
        datatype: args.datatype.clone(),
        algo: args.algo.clone(),
        proto: args.proto.clone(),
        channels: args.channels,
        exec_ns: (bytes as f64 / args.gbps.max(1e-3)).ceil() as u64,
    };
    Ok((op, count))
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("heddle-profiler-drive: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let spool = match (&args.spool, args.bench) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(_)) => Some(private_temp_dir()?),
        (None, None) => None,
    };
    let temporary = args.spool.is_none() && spool.is_some();
    let net = match args.net.as_str() {
        "IB" | "ib" => Some(Net::Ib),
        "Socket" | "socket" => Some(Net::Socket),
        "none" => None,
        "silent" => Some(Net::Silent),
        _ => Some(Net::Other(3)),
    };
    // SAFETY: still single-threaded: no other thread reads the environment yet.
    unsafe {
        if let Some(s) = &spool {
            std::env::set_var("HEDDLE_PROFILER_SPOOL", s);
        }
        if let Some(i) = args.interval {
            std::env::set_var("HEDDLE_PROFILER_INTERVAL_S", i.to_string());
        }
        if matches!(net, Some(Net::Other(_))) {
            std::env::set_var("NCCL_NET_PLUGIN", &args.net);
        }
    }
    let table = load(&args.lib)?;
    // SAFETY: the library stays loaded (never closed) for the rest of the process.
    let host = unsafe { Host::new(table) };
    if let Some(pairs) = args.bench {
        let result = bench(&host, &args, pairs);
        if temporary && let Some(dir) = &spool {
            let _ = std::fs::remove_dir_all(dir);
        }
        return result;
    }
    let ops = args
        .ops
        .iter()
        .map(|s| parse_op(s, &args))
        .collect::<Result<Vec<_>, _>>()?;
    let id = match &args.comm_id {
        Some(h) => {
            u64::from_str_radix(h.trim_start_matches("0x"), 16).map_err(|_| "--comm-id: hex")?
        }
        None => 0x4845_0000_0000_0000 | std::process::id() as u64,
    };
    let (comm, rc) = host.init(
        id,
        args.comm_name.as_deref(),
        args.nnodes,
        args.comm_nranks,
        args.rank,
    );
    let mut failures = (rc != 0) as usize;
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let start = args.start_at_ms.unwrap_or_else(now_ms);
    let total: u64 = ops.iter().map(|(_, n)| n).sum();
    let mut i = 0u64;
    for (op, count) in &ops {
        let prepared = Prepared::new(op);
        for _ in 0..*count {
            let at = start + i * args.period_ms + args.late_ms;
            if let Some(wait) = at.checked_sub(now_ms()).filter(|w| *w > 0) {
                std::thread::sleep(std::time::Duration::from_millis(wait));
            }
            i += 1;
            let mut rcs = Vec::new();
            if args.hang_last && i == total {
                host.run_stuck(comm, &prepared, net.as_ref(), &mut rcs);
            } else {
                host.run(comm, &prepared, net.as_ref(), &mut rcs);
            }
            failures += rcs.iter().filter(|&&rc| rc != 0).count();
        }
    }
    if args.linger_s > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(
            args.linger_s.min(3600.0),
        ));
    }
    if !args.no_finalize {
        failures += (host.finalize(comm) != 0) as usize;
    }
    for line in host::LOG.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        eprintln!("NCCL INFO {line}");
    }
    if failures > 0 {
        return Err(format!("the plugin returned an error {failures} times"));
    }
    Ok(())
}

fn load(lib: &std::path::Path) -> Result<*const ProfilerV5, String> {
    let path =
        CString::new(lib.as_os_str().as_encoded_bytes()).map_err(|_| "--lib: NUL in path")?;
    // SAFETY: loads the plugin as NCCL does (RTLD_NOW | RTLD_LOCAL); never closed.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns the loader's last message or NULL.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated message.
            unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!("cannot load {}: {msg}", lib.display()));
    }
    // SAFETY: looks the table up by NCCL's name.
    let sym = unsafe { libc::dlsym(handle, c"ncclProfiler_v5".as_ptr()) };
    if sym.is_null() {
        return Err(format!("{} exports no ncclProfiler_v5", lib.display()));
    }
    Ok(sym as *const ProfilerV5)
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the struct; the calling thread's CPU clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn private_temp_dir() -> Result<PathBuf, String> {
    let template = std::env::temp_dir().join("heddle-drive-XXXXXX");
    let mut buf = CString::new(template.as_os_str().as_encoded_bytes())
        .map_err(|_| "temp dir")?
        .into_bytes_with_nul();
    // SAFETY: a writable NUL-terminated template; mkdtemp creates it with mode 0700.
    let p = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(format!("mkdtemp: {}", std::io::Error::last_os_error()));
    }
    buf.pop();
    Ok(PathBuf::from(String::from_utf8_lossy(&buf).into_owned()))
}

/// ns per start+stop pair of a collective event (what NCCL's launching thread pays per
/// operation), and per operation with its kernel channel events (which NCCL's proxy
/// thread reports), one communicator per thread. The figures include this host's own
/// descriptor handling, as NCCL's include its own.
fn bench(host: &Host, args: &Args, pairs: u64) -> Result<(), String> {
    let op = Op {
        func: "AllReduce".into(),
        count: 2048,
        datatype: "ncclFloat32".into(),
        algo: "RING".into(),
        proto: "LL".into(),
        channels: args.channels,
        exec_ns: 1000,
    };
    let comms: Vec<_> = (0..args.threads.max(1))
        .map(|t| host.init(0x4245_4e43_0000_0000 | t as u64, None, 1, 2, 0).0)
        .collect();
    let pair_only = Prepared::new(&Op {
        channels: 0,
        ..op.clone()
    });
    let op = Prepared::new(&op);
    // Wall time per pair as each thread sees it, and CPU time per pair of the threads
    // themselves: on a loaded machine threads wait for a core (wall grows, CPU does not);
    // contention between them shows in CPU time.
    let measure = |op: &Prepared| {
        let start = Instant::now();
        let cpu: u64 = std::thread::scope(|s| {
            let threads: Vec<_> = comms
                .iter()
                .map(|&comm| {
                    s.spawn(move || {
                        let mut rcs = Vec::with_capacity(64);
                        let c0 = thread_cpu_ns();
                        for _ in 0..pairs {
                            rcs.clear();
                            host.run(comm, op, None, &mut rcs);
                        }
                        thread_cpu_ns() - c0
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
        });
        let wall = start.elapsed().as_nanos() as f64 / pairs as f64;
        (wall, cpu as f64 / (pairs as f64 * comms.len() as f64))
    };
    // Warm-up, then the figures.
    measure(&pair_only);
    let (wall_pair, cpu_pair) = measure(&pair_only);
    let (wall_op, cpu_op) = measure(&op);
    for comm in comms {
        host.finalize(comm);
    }
    let r = |x: f64| (x * 10.0).round() / 10.0;
    let out = serde_json::json!({
        "threads": args.threads.max(1),
        "pairs_per_thread": pairs,
        "ns_per_start_stop_pair": r(wall_pair),
        "cpu_ns_per_start_stop_pair": r(cpu_pair),
        "channels": args.channels,
        "ns_per_op_with_kernel_channels": r(wall_op),
        "cpu_ns_per_op_with_kernel_channels": r(cpu_op),
        "mask": format!("0x{:x}", host.mask()),
        "plugin": host.name(),
    });
    println!("{out}");
    Ok(())
}
