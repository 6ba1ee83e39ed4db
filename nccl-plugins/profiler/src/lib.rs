//! Heddle's NCCL profiler plugin (`libnccl-profiler-heddle.so`).
//!
//! NCCL loads it when `NCCL_PROFILER_PLUGIN=heddle` (or its path) is set and calls it on
//! every collective and point-to-point operation. The plugin adds each one to a per
//! communicator × function × size band aggregate (operations, bytes, launch time, GPU
//! time, algorithm and protocol mix, channels) and notes which network carried the proxy
//! traffic; a thread of its own writes the aggregates to the node's spool directory every
//! few seconds (`heddle_types::observe::SpoolFile`), where the agent reads them.
//!
//! It runs inside the job, so: every exported function catches panics and returns
//! `ncclSuccess`; the event path takes no lock and allocates nothing (a fixed slot pool,
//! atomics); any failure turns the plugin off for the process with one INFO line in NCCL's
//! log. docs/profiler.md is its manual.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

pub mod abi;
mod comms;
pub mod config;
mod engine;
pub mod host;
mod identity;
mod log;
pub mod names;
mod progress;
mod slots;
mod source;
mod spool;
mod writer;

use abi::{EventDescrV4, EventDescrV5, Logger, NCCL_SUCCESS, NcclResult, StateArgs, event};
use engine::Task;

/// Runs `f`, turning a panic into "plugin off"; always `ncclSuccess` for NCCL.
fn guarded(f: impl FnOnce()) -> NcclResult {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        let _ = catch_unwind(|| engine::disable("internal error"));
    }
    NCCL_SUCCESS
}

/// # Safety
/// Called by NCCL with valid out-pointers (`context` may not be NULL).
#[allow(clippy::too_many_arguments)]
unsafe fn init(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logger: Option<Logger>,
) -> NcclResult {
    if !context.is_null() {
        // SAFETY: NCCL's out-pointer.
        unsafe { *context = std::ptr::null_mut() };
    }
    guarded(|| {
        let ctx = engine::init(comm_id, mask, name, nnodes, nranks, rank, logger);
        if !context.is_null() {
            // SAFETY: as above.
            unsafe { *context = ctx as *mut c_void };
        }
    })
}

unsafe extern "C" fn init_v5(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    name: *const c_char,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logger: Option<Logger>,
) -> NcclResult {
    // SAFETY: NCCL's arguments, passed on.
    unsafe { init(context, comm_id, mask, name, nnodes, nranks, rank, logger) }
}

unsafe extern "C" fn init_v4(
    context: *mut *mut c_void,
    mask: *mut c_int,
    name: *const c_char,
    comm_hash: u64,
    nnodes: c_int,
    nranks: c_int,
    rank: c_int,
    logger: Option<Logger>,
) -> NcclResult {
    // SAFETY: NCCL's arguments, passed on.
    unsafe { init(context, comm_hash, mask, name, nnodes, nranks, rank, logger) }
}

/// One event, whichever interface version described it.
enum Start {
    Task(Task),
    KernelCh { parent: usize, gpu_start: u64 },
    Net { id: i64, data: *const c_void },
    ProxyOp { parent: usize, pid: i32 },
}

fn start(context: *mut c_void, handle: *mut *mut c_void, ev: Option<Start>) -> NcclResult {
    if handle.is_null() {
        return NCCL_SUCCESS;
    }
    // SAFETY: NCCL's out-pointer; cleared first so that it holds NULL whatever happens.
    unsafe { *handle = std::ptr::null_mut() };
    let Some(ev) = ev else { return NCCL_SUCCESS };
    let ctx = context as usize;
    guarded(|| {
        let h = match ev {
            // SAFETY: NCCL's static name strings.
            Start::Task(task) => unsafe { engine::start_task(ctx, &task) },
            Start::KernelCh { parent, gpu_start } => engine::start_kernel_ch(parent, gpu_start),
            Start::Net { id, data } => {
                // SAFETY: the net plugin's descriptor of the version its id names.
                unsafe { engine::net_event(ctx, id, data) };
                0
            }
            Start::ProxyOp { parent, pid } => engine::proxy_op(ctx, parent, pid),
        };
        // SAFETY: as above.
        unsafe { *handle = h as *mut c_void };
    })
}

unsafe extern "C" fn start_event_v5(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescrV5,
) -> NcclResult {
    let ev = if descr.is_null() {
        None
    } else {
        // SAFETY: NCCL's descriptor for this call; the union member read is the one its
        // type names.
        let d = unsafe { &*descr };
        unsafe { read_v5(d) }
    };
    start(context, handle, ev)
}

/// # Safety
/// `d` is a descriptor NCCL filled for its `type_`.
unsafe fn read_v5(d: &EventDescrV5) -> Option<Start> {
    if !engine::wanted(d.type_) {
        return None;
    }
    // SAFETY: each arm reads the union member of the descriptor's type.
    unsafe {
        Some(match d.type_ {
            event::COLL => Start::Task(Task {
                coll: true,
                seq_number: Some(d.u.coll.seq_number),
                func: d.u.coll.func,
                count: d.u.coll.count,
                datatype: d.u.coll.datatype,
                n_channels: d.u.coll.n_channels,
                algo: d.u.coll.algo,
                proto: d.u.coll.proto,
            }),
            event::P2P => Start::Task(Task {
                coll: false,
                seq_number: None,
                func: d.u.p2p.func,
                count: d.u.p2p.count,
                datatype: d.u.p2p.datatype,
                n_channels: d.u.p2p.n_channels,
                algo: std::ptr::null(),
                proto: std::ptr::null(),
            }),
            event::KERNEL_CH => Start::KernelCh {
                parent: d.parent_obj as usize,
                gpu_start: d.u.kernel_ch.p_timer,
            },
            event::NET_PLUGIN => Start::Net {
                id: d.u.net_plugin.id,
                data: d.u.net_plugin.data,
            },
            event::PROXY_OP => Start::ProxyOp {
                parent: d.parent_obj as usize,
                pid: d.u.proxy_op.pid,
            },
            _ => return None,
        })
    }
}

unsafe extern "C" fn start_event_v4(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescrV4,
) -> NcclResult {
    let ev = if descr.is_null() {
        None
    } else {
        // SAFETY: NCCL's descriptor for this call.
        let d = unsafe { &*descr };
        let type_ = d.type_ as u64;
        // SAFETY: each arm reads the union member of the descriptor's type.
        unsafe {
            match type_ {
                event::COLL => Some(Start::Task(Task {
                    coll: true,
                    seq_number: Some(d.u.coll.seq_number),
                    func: d.u.coll.func,
                    count: d.u.coll.count,
                    datatype: d.u.coll.datatype,
                    n_channels: d.u.coll.n_channels,
                    algo: d.u.coll.algo,
                    proto: d.u.coll.proto,
                })),
                event::P2P => Some(Start::Task(Task {
                    coll: false,
                    seq_number: None,
                    func: d.u.p2p.func,
                    count: d.u.p2p.count,
                    datatype: d.u.p2p.datatype,
                    n_channels: d.u.p2p.n_channels,
                    algo: std::ptr::null(),
                    proto: std::ptr::null(),
                })),
                event::KERNEL_CH => Some(Start::KernelCh {
                    parent: d.parent_obj as usize,
                    gpu_start: d.u.kernel_ch.p_timer,
                }),
                event::NET_PLUGIN => Some(Start::Net {
                    id: d.u.net_plugin.id,
                    data: d.u.net_plugin.data,
                }),
                event::PROXY_OP => Some(Start::ProxyOp {
                    parent: d.parent_obj as usize,
                    pid: d.u.proxy_op.pid,
                }),
                _ => None,
            }
        }
    };
    start(context, handle, ev)
}

unsafe extern "C" fn stop_event(handle: *mut c_void) -> NcclResult {
    if handle.is_null() {
        return NCCL_SUCCESS;
    }
    guarded(|| engine::stop(handle as usize))
}

unsafe extern "C" fn record_event_state(
    handle: *mut c_void,
    state: c_int,
    args: *mut StateArgs,
) -> NcclResult {
    if handle.is_null() || args.is_null() || state != abi::STATE_KERNEL_CH_STOP {
        return NCCL_SUCCESS;
    }
    // SAFETY: NCCL's arguments for a kernel channel stop carry the GPU timer.
    let gpu_stop = unsafe { (*args).p_timer };
    guarded(|| engine::kernel_ch_stopped(handle as usize, gpu_stop))
}

unsafe extern "C" fn finalize(context: *mut c_void) -> NcclResult {
    guarded(|| engine::finalize(context as usize))
}

const NAME: &std::ffi::CStr = c"heddle";

/// What NCCL 2.28 looks up (`ncclProfiler_v5`).
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v5: abi::ProfilerV5 = abi::ProfilerV5 {
    name: NAME.as_ptr(),
    init: init_v5,
    start_event: start_event_v5,
    stop_event,
    record_event_state,
    finalize,
};

/// What NCCL 2.25 to 2.27 look up (`ncclProfiler_v4`): the same events at the same
/// descriptor offsets, a one-byte type and another order of `init`'s arguments.
#[unsafe(no_mangle)]
#[allow(non_upper_case_globals)]
pub static ncclProfiler_v4: abi::ProfilerV4 = abi::ProfilerV4 {
    name: NAME.as_ptr(),
    init: init_v4,
    start_event: start_event_v4,
    stop_event,
    record_event_state,
    finalize,
};
