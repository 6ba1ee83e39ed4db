//! The process-wide profiler: set up at NCCL's first `init`, then the event path. Every
//! event handler is lock-free and allocation-free: a flag check, a few loads of NCCL's
//! descriptor, and atomics on the slot pool and the communicator's rows.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, OnceLock};

use heddle_types::observe::{JobIdentity, MAX_COMMS};

use crate::abi::{self, event};
use crate::comms::{Comm, Done, NO_ALGO};
use crate::config::Config;
use crate::names::{algo_id, bytes, clean_text, datatype_size, func_id, proto_id, size_band};
use crate::slots::{self, Kind, Pool, Slot, Start};
use crate::spool::SpoolDir;
use crate::{log, writer};

/// Operations older than this that still wait for kernel channel events are counted
/// without a GPU time (see `Pool::sweep`).
pub const STALE_NS: u64 = 30_000_000_000;
/// A GPU time above this is a broken timestamp, not a transfer.
const MAX_EXEC_NS: u64 = 3_600_000_000_000;
/// Tag of the context words given to NCCL: "H" << 56 | low 24 bits of the pid << 16 |
/// communicator index + 1. With PXN, NCCL hands a proxy thread of another process the
/// context of the process that created the operation; the pid in the word keeps such a
/// context from being taken for one of this process's communicators.
const CTX_TAG: usize = 0x48 << 56;

fn ctx_word(pid: u32, index: usize) -> usize {
    CTX_TAG | ((pid as usize & 0xff_ffff) << 16) | (index + 1)
}

/// Whether events are recorded. Cleared for good by `disable`.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Set once the plugin turned itself off (it stays off for the process).
static DISABLED: AtomicBool = AtomicBool::new(false);
static STATE: OnceLock<State> = OnceLock::new();
/// Serialises `init` and `finalize` (never taken on the event path).
pub static LIFECYCLE: Mutex<()> = Mutex::new(());

pub struct State {
    pub config: Config,
    pub pool: Pool,
    pub comms: Box<[OnceLock<Comm>]>,
    registered: AtomicUsize,
    live: AtomicUsize,
    /// Operations whose timing was lost because every probed slot was busy (they are
    /// still counted, with their bytes, in their rows).
    pub dropped_events: AtomicU64,
    pub dropped_comms: AtomicU64,
    /// NCCL's activation mask (a global of libnccl), to turn events off when disabling.
    mask: AtomicPtr<c_int>,
    /// Whether the mask asks for kernel channel events now (they are on for part of each
    /// interval: `Config::kernel`).
    kernel_on: AtomicBool,
    pub identity: JobIdentity,
    pub nccl_version: Mutex<Option<String>>,
    pub env_applied: Mutex<Option<String>>,
    pub spool: SpoolDir,
    /// The next sequence number; held while a file is written.
    pub seq: Mutex<u64>,
    pub writer: Mutex<Option<writer::Writer>>,
}

/// The state, while events are being recorded.
#[inline]
pub fn active() -> Option<&'static State> {
    if ENABLED.load(Relaxed) {
        STATE.get()
    } else {
        None
    }
}

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the struct; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Turns the plugin off for the rest of the process: no more events are recorded, NCCL is
/// asked for none, and one INFO line in NCCL's log says why.
pub fn disable(reason: &str) {
    ENABLED.store(false, Relaxed);
    if DISABLED.swap(true, Relaxed) {
        return;
    }
    if let Some(s) = STATE.get() {
        let mask = s.mask.load(Relaxed);
        if !mask.is_null() {
            // SAFETY: NCCL's own global, which it reads atomically; set at `init`.
            unsafe { NcclMask::store(mask, 0) };
        }
    }
    log::info(&format!("heddle profiler off for this process: {reason}"));
}

impl State {
    /// The events to ask NCCL for now.
    fn current_mask(&self) -> u64 {
        self.config.mask_with_kernel(self.kernel_on.load(Relaxed))
    }

    /// Turns kernel channel events on or off for every communicator of the process (the
    /// writer does, at the start of each interval and at the end of its kernel window).
    /// NCCL reads the mask once per group of operations, so an operation started while it
    /// changes may expect channel events that never come (finished untimed when stale) or
    /// get some it did not expect (ignored once it is done): one measurement lost, no more.
    pub fn set_kernel_events(&self, on: bool) {
        if self.kernel_on.swap(on, Relaxed) == on {
            return;
        }
        let mask = self.mask.load(Relaxed);
        if mask.is_null() || active().is_none() {
            return;
        }
        // SAFETY: NCCL's own global, which it reads atomically; set at `init`.
        unsafe { NcclMask::store(mask, self.current_mask()) };
        // A `disable` between the check and the store must win: ask for nothing again.
        if active().is_none() {
            // SAFETY: as above.
            unsafe { NcclMask::store(mask, 0) };
        }
    }
}

/// NCCL's mask is a plain `int` that NCCL loads atomically; store to it the same way.
struct NcclMask;

impl NcclMask {
    /// # Safety
    /// `p` is NCCL's activation mask (an aligned, live `int`).
    unsafe fn store(p: *mut c_int, v: u64) {
        // SAFETY: the caller's promise; i32 and AtomicI32 have the same layout.
        unsafe { std::sync::atomic::AtomicI32::from_ptr(p) }.store(v as i32, Relaxed);
    }
}

/// A communicator NCCL is initialising. Returns the context word to give back to NCCL
/// (0 when the plugin is off or the communicator is one too many).
#[allow(clippy::too_many_arguments)]
pub fn init(
    comm_id: u64,
    mask: *mut c_int,
    name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logger: Option<abi::Logger>,
) -> usize {
    let _guard = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
    log::set_logger(logger);
    if DISABLED.load(Relaxed) {
        if !mask.is_null() {
            // SAFETY: NCCL's mask, valid for the call.
            unsafe { NcclMask::store(mask, 0) };
        }
        return 0;
    }
    let first = STATE.get().is_none();
    let state = match STATE.get() {
        Some(s) => s,
        None => match set_up(logger) {
            Ok(s) => s,
            Err(reason) => {
                if !mask.is_null() {
                    // SAFETY: as above.
                    unsafe { NcclMask::store(mask, 0) };
                }
                disable(&reason);
                return 0;
            }
        },
    };
    if !mask.is_null() {
        state.mask.store(mask, Relaxed);
        // SAFETY: as above.
        unsafe { NcclMask::store(mask, state.current_mask()) };
    }
    state.live.fetch_add(1, AcqRel);
    let index = state.registered.fetch_add(1, AcqRel);
    let ctx = match state.comms.get(index) {
        Some(cell) => {
            // SAFETY: NCCL's communicator name is NULL or a NUL-terminated string.
            let name = String::from_utf8_lossy(unsafe { bytes(name) });
            let name = Some(clean_text(&name)).filter(|n| !n.is_empty());
            let comm = Comm::new(comm_id, name, nnodes, nranks, rank);
            if let Some(other) = std::env::var("NCCL_NET_PLUGIN")
                .ok()
                .map(|n| clean_text(&n))
                .filter(|n| !n.is_empty())
            {
                let _ = comm.other_net_name.set(other);
            }
            let _ = cell.set(comm);
            ctx_word(state.identity.pid, index)
        }
        None => {
            state.dropped_comms.fetch_add(1, Relaxed);
            0
        }
    };
    refresh_facts(state, logger);
    ENABLED.store(true, Release);
    // A first write at once: the job is visible from its start, and a spool directory the
    // process cannot write to turns the plugin off now rather than at the first tick.
    // Later communicators wait for the writer (a job may create many in a row).
    if first && let Err(e) = writer::write_from_nccl(state, false) {
        disable(&format!(
            "cannot write {}/{}: {e}",
            state.config.spool.display(),
            state.spool.file_name()
        ));
        return ctx;
    }
    if let Err(e) = writer::ensure_running(state) {
        disable(&format!("cannot start its writer thread: {e}"));
        return ctx;
    }
    if first {
        log::info(&format!(
            "heddle profiler {}: writing {}/{} every {:?} (events 0x{:x}, kernel channels {:.0} % of the time, {} slots)",
            env!("CARGO_PKG_VERSION"),
            state.config.spool.display(),
            state.spool.file_name(),
            state.config.interval,
            state.config.activation_mask(),
            state.config.kernel * 100.0,
            state.pool.len()
        ));
    }
    ctx
}

fn set_up(logger: Option<abi::Logger>) -> Result<&'static State, String> {
    let config = Config::from_env();
    if config.disabled {
        return Err("HEDDLE_PROFILER_DISABLE is set".into());
    }
    let identity = crate::identity::job_identity();
    let spool = SpoolDir::open(&config.spool, identity.pid, identity.start_ticks)
        .map_err(|e| format!("spool directory {}: {e}", config.spool.display()))?;
    let state = State {
        pool: Pool::new(config.slots),
        comms: (0..MAX_COMMS).map(|_| OnceLock::new()).collect(),
        registered: AtomicUsize::new(0),
        live: AtomicUsize::new(0),
        dropped_events: AtomicU64::new(0),
        dropped_comms: AtomicU64::new(0),
        mask: AtomicPtr::new(std::ptr::null_mut()),
        kernel_on: AtomicBool::new(config.kernel > 0.0),
        nccl_version: Mutex::new(crate::identity::nccl_version(
            logger.map_or(std::ptr::null(), |l| l as *const c_void),
        )),
        env_applied: Mutex::new(None),
        identity,
        spool,
        seq: Mutex::new(0),
        writer: Mutex::new(None),
        config,
    };
    let _ = STATE.set(state);
    register_exit_handler();
    STATE.get().ok_or_else(|| "state not kept".to_string())
}

/// Registers (once) a last write when the process exits; `-z nodelete` keeps the handler
/// mapped even after NCCL unloads the plugin.
fn register_exit_handler() {
    extern "C" fn at_exit() {
        let _ = std::panic::catch_unwind(|| {
            let Some(state) = active() else {
                return;
            };
            // After the last finalize the final file is written already.
            if !all_finalized(state) {
                let _ = writer::write_from_nccl(state, false);
            }
        });
    }
    // SAFETY: registers a function that never unwinds (it catches panics).
    unsafe { libc::atexit(at_exit) };
}

/// Facts that may appear after the first communicator: the environment plugin's hash.
fn refresh_facts(state: &State, logger: Option<abi::Logger>) {
    let mut env = state.env_applied.lock().unwrap_or_else(|e| e.into_inner());
    if env.is_none() {
        *env = crate::identity::env_applied();
    }
    let mut v = state.nccl_version.lock().unwrap_or_else(|e| e.into_inner());
    if v.is_none() {
        *v = crate::identity::nccl_version(logger.map_or(std::ptr::null(), |l| l as *const c_void));
    }
}

/// NCCL is done with a communicator. The last one writes the final file and stops the
/// writer thread (NCCL may unload the plugin right after).
pub fn finalize(ctx: usize) {
    let _guard = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = active() else {
        return;
    };
    let newly = match comm_of(state, ctx) {
        Some((_, comm)) => comm.finalize(chrono::Utc::now().timestamp_millis()),
        None => ctx == 0,
    };
    if !newly {
        return;
    }
    let left = state
        .live
        .fetch_update(AcqRel, Acquire, |n| Some(n.saturating_sub(1)))
        .unwrap_or(0)
        .saturating_sub(1);
    if left == 0 {
        writer::stop(state);
        // Whatever still waits for kernel events will not get them now.
        state
            .pool
            .sweep(u64::MAX, 0, |slot| finish(state, slot, false));
    }
    if let Err(e) = writer::write_from_nccl(state, left == 0) {
        disable(&format!("cannot write its spool file: {e}"));
    }
}

pub fn all_finalized(state: &State) -> bool {
    state.live.load(Acquire) == 0
}

fn comm_of(state: &State, ctx: usize) -> Option<(u32, &Comm)> {
    if ctx & !0xffff != ctx_word(state.identity.pid, 0) & !0xffff {
        return None;
    }
    let index = (ctx & 0xffff).checked_sub(1)?;
    Some((index as u32, state.comms.get(index)?.get()?))
}

/// A collective or point-to-point operation, read from NCCL's descriptor.
pub struct Task {
    pub coll: bool,
    /// NCCL's `seqNumber` of a collective.
    pub seq_number: Option<u64>,
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// `startEvent` of a collective or point-to-point operation: its handle, or 0.
///
/// # Safety
/// The strings in `task` are NULL or NUL-terminated (NCCL's static names).
pub unsafe fn start_task(ctx: usize, task: &Task) -> usize {
    let Some(state) = active() else { return 0 };
    let Some((comm_index, comm)) = comm_of(state, ctx) else {
        return 0;
    };
    // SAFETY: the caller's promise.
    let (func, datatype) = unsafe { (func_id(bytes(task.func)), bytes(task.datatype)) };
    let total = (task.count as u64).saturating_mul(datatype_size(datatype));
    let now = now_ns();
    let op = comm
        .progress
        .start(!task.coll, func, total, task.seq_number, now);
    let Some(row) = comm.row_for(func, size_band(total)) else {
        comm.dropped_rows.fetch_add(1, Relaxed);
        return 0;
    };
    let (algo, proto) = if task.coll {
        // SAFETY: the caller's promise.
        unsafe { (algo_id(bytes(task.algo)), proto_id(bytes(task.proto))) }
    } else {
        NO_ALGO
    };
    let kernels = if state.kernel_on.load(Relaxed) {
        task.n_channels as u32
    } else {
        0
    };
    let start = Start {
        comm: comm_index,
        row,
        bytes: total,
        meta: algo as u32 | (proto as u32) << 8 | (task.n_channels as u32) << 16,
        start_ns: now,
        op: op as u32,
        refs: 1 + kernels,
    };
    match state.pool.claim(&start) {
        Some(h) => h,
        None => {
            // No slot: the operation still counts, untimed.
            state.dropped_events.fetch_add(1, Relaxed);
            comm.add(
                row,
                &Done {
                    bytes: total,
                    time_ns: 0,
                    exec_ns: None,
                    algo,
                    proto,
                    channels: task.n_channels as u32,
                },
            );
            0
        }
    }
}

/// `startEvent` of a kernel channel of an operation (`parent` is the operation's handle):
/// the channel's handle, or 0.
pub fn start_kernel_ch(parent: usize, gpu_start: u64) -> usize {
    let Some(state) = active() else { return 0 };
    let Some((generation, Kind::Task, index)) = slots::decode(parent) else {
        return 0;
    };
    let Some(slot) = state.pool.live(generation, index) else {
        return 0;
    };
    if gpu_start != 0 {
        slot.gpu_start.fetch_min(gpu_start, Relaxed);
    }
    slots::handle(generation, Kind::KernelCh, index)
}

/// `recordEventState(KernelChStop)`: the channel's GPU stop time.
pub fn kernel_ch_stopped(handle: usize, gpu_stop: u64) {
    let Some(state) = active() else { return };
    if let Some((generation, Kind::KernelCh, index)) = slots::decode(handle)
        && let Some(slot) = state.pool.live(generation, index)
    {
        slot.gpu_stop.fetch_max(gpu_stop, Relaxed);
    }
}

/// `stopEvent` of an operation or one of its kernel channels.
pub fn stop(handle: usize) {
    let Some(state) = active() else { return };
    let Some((generation, kind, index)) = slots::decode(handle) else {
        return;
    };
    if kind == Kind::Proxy {
        if let Some(comm) = state.comms.get(index & 0xffff).and_then(OnceLock::get) {
            let op = (index & PROXY_NO_OP == 0).then(|| comm.progress.op_of(generation));
            comm.progress.proxy_stopped(op, now_ns());
        }
        return;
    }
    if kind == Kind::Task {
        match state.pool.live(generation, index) {
            Some(slot) => slot.stop_ns.store(now_ns(), Relaxed),
            None => return,
        }
    }
    state
        .pool
        .release(generation, index, |slot| finish(state, slot, true));
}

/// Adds a finished operation to its communicator's row.
pub fn finish(state: &State, slot: &Slot, complete: bool) {
    let Some(comm) = state
        .comms
        .get(slot.comm.load(Relaxed) as usize)
        .and_then(OnceLock::get)
    else {
        return;
    };
    let meta = slot.meta.load(Relaxed);
    let (start, stop) = (slot.start_ns.load(Relaxed), slot.stop_ns.load(Relaxed));
    let (g0, g1) = (slot.gpu_start.load(Relaxed), slot.gpu_stop.load(Relaxed));
    let exec_ns = (complete && g0 != u64::MAX && g1 > g0 && g1 - g0 < MAX_EXEC_NS).then(|| g1 - g0);
    if exec_ns.is_some() {
        // Its last kernel channel stopped on the GPU: it is complete.
        let op = comm.progress.op_of(slot.op.load(Relaxed));
        comm.progress.completed(op);
    }
    comm.add(
        slot.row.load(Relaxed),
        &Done {
            bytes: slot.bytes.load(Relaxed),
            time_ns: stop.saturating_sub(start),
            exec_ns,
            algo: meta as u8,
            proto: (meta >> 8) as u8,
            channels: meta >> 16,
        },
    );
}

/// A network plugin event: which network, and the bytes it sent.
///
/// # Safety
/// `data` is NULL or the net plugin's descriptor of the version named in `id`.
pub unsafe fn net_event(ctx: usize, id: i64, data: *const c_void) {
    let Some(state) = active() else { return };
    let Some((_, comm)) = comm_of(state, ctx) else {
        return;
    };
    let net_type = id & abi::NET_TYPE_MASK;
    let version = id & abi::NET_VER_MASK;
    let sent = if data.is_null() || version != 1 {
        0
    } else if net_type == abi::NET_TYPE_IB {
        // SAFETY: the caller's promise (IB, version 1).
        let d = unsafe { &*(data as *const abi::NetIbDescrV1) };
        if d.type_ == abi::NET_IB_QP {
            d.qp.length as u64
        } else {
            0
        }
    } else if net_type == abi::NET_TYPE_SOCK {
        // SAFETY: the caller's promise (socket, version 1).
        let d = unsafe { &*(data as *const abi::NetSockDescrV1) };
        // NCCL_SOCKET_SEND is 0; receives are the peer's sends.
        if d.type_ == abi::NET_SOCK_SOCKET && d.sock.op == 0 {
            d.sock.length as u64
        } else {
            0
        }
    } else {
        0
    };
    comm.add_net(net_type as u64, sent);
}

/// Set in a proxy handle's index when its operation is not known.
const PROXY_NO_OP: usize = 1 << 22;

/// A proxy operation started for this communicator (`parent`: its operation's handle,
/// `pid`: the process that created it). Its handle names the communicator and the
/// operation, so that its stop completes the operation (`progress.rs`).
pub fn proxy_op(ctx: usize, parent: usize, pid: i32) -> usize {
    let Some(state) = active() else { return 0 };
    let Some((index, comm)) = comm_of(state, ctx) else {
        return 0;
    };
    comm.proxy_ops.fetch_add(1, Relaxed);
    // Another process's operation (PXN): its parent is that process's handle.
    let op = (pid as u32 == state.identity.pid)
        .then(|| state.pool.op_of(parent))
        .flatten();
    comm.progress
        .proxy_started(op.map(|low| comm.progress.op_of(low)));
    match op {
        Some(low) => slots::handle(low, Kind::Proxy, index as usize),
        None => slots::handle(0, Kind::Proxy, index as usize | PROXY_NO_OP),
    }
}

/// Event types the plugin asks for and uses; others get no handle.
pub fn wanted(type_: u64) -> bool {
    type_ & (event::COLL | event::P2P | event::KERNEL_CH | event::NET_PLUGIN | event::PROXY_OP) != 0
}
