//! Plays NCCL's part against a loaded profiler plugin: the calls NCCL 2.28 makes, in its
//! order, with descriptors laid out as its headers say (`abi`). The driver binary and the
//! tests use it on the built library; the plugin itself never calls it.
//!
//! One operation is what `ncclProfilerStartTaskEvents` .. `ncclProfilerStopTaskEvents`
//! and the proxy thread produce: the operation's start, a kernel channel event per
//! channel (GPU start in the descriptor, GPU stop through `recordEventState`), on a
//! multi-node communicator a proxy operation and network plugin events per channel, and
//! the operation's stop.

use std::ffi::{CStr, CString, c_char, c_int, c_ulong, c_void};
use std::sync::Mutex;

use crate::abi::{self, EventDescrV5, ProfilerV5, StateArgs, event};

/// Lines the plugin wrote through the logger this host passed.
pub static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Stands in for NCCL's variadic logger: the plugin always logs with `"%s"` and one
/// string, which a non-variadic function with that extra parameter receives unchanged on
/// the LP64 Linux calling conventions.
unsafe extern "C" fn log_line(
    _level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    _fmt: *const c_char,
    arg: *const c_char,
) {
    if arg.is_null() {
        return;
    }
    // SAFETY: the plugin passes a NUL-terminated line.
    let line = unsafe { CStr::from_ptr(arg) }
        .to_string_lossy()
        .into_owned();
    LOG.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

pub fn logger() -> abi::Logger {
    type Plain =
        unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, *const c_char);
    // SAFETY: see `log_line`.
    unsafe { std::mem::transmute::<Plain, abi::Logger>(log_line as Plain) }
}

/// The network a multi-node operation's proxy traffic goes over.
#[derive(Clone, Debug, PartialEq)]
pub enum Net {
    Ib,
    Socket,
    /// Another net plugin: its profiler type number (>= 3).
    Other(u16),
    /// Proxy operations without network events: NCCL's own IB and socket transports in
    /// builds without `NET_PROFILER=1` (NVIDIA's packages among them).
    Silent,
}

/// One operation to simulate.
#[derive(Clone, Debug)]
pub struct Op {
    pub func: String,
    pub count: usize,
    pub datatype: String,
    pub algo: String,
    pub proto: String,
    pub channels: u8,
    /// GPU time from the first channel's start to the last one's stop.
    pub exec_ns: u64,
}

impl Op {
    pub fn is_p2p(&self) -> bool {
        self.func == "Send" || self.func == "Recv"
    }
}

pub struct Host {
    table: &'static ProfilerV5,
    /// NCCL's global activation mask: the plugin keeps its address.
    mask: &'static c_int,
    /// Send events whatever the mask says (to drive a plugin that turned itself off).
    pub ignore_mask: bool,
    /// NCCL's `seqNumber` of the next collective.
    seq: std::sync::atomic::AtomicU64,
}

// The simulated GPU timer, per thread (a shared counter would make the benchmark measure
// its own contention).
thread_local! {
    static GPU_CLOCK: std::cell::Cell<u64> = const { std::cell::Cell::new(1_000_000_000) };
}

/// A communicator as the plugin knows it.
#[derive(Clone, Copy)]
pub struct Comm {
    pub ctx: *mut c_void,
    pub nnodes: c_int,
}

// SAFETY: the context is an opaque word the plugin gave; NCCL passes it between threads.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

impl Host {
    /// # Safety
    /// `table` is a plugin's `ncclProfiler_v5`, loaded for the rest of the process.
    pub unsafe fn new(table: *const ProfilerV5) -> Host {
        Host {
            // SAFETY: the caller's promise.
            table: unsafe { &*table },
            mask: Box::leak(Box::new(0)),
            ignore_mask: false,
            seq: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> String {
        // SAFETY: the plugin's static name.
        unsafe { CStr::from_ptr(self.table.name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The activation mask the plugin asked for.
    pub fn mask(&self) -> u64 {
        // SAFETY: a live int; the plugin stores to it atomically.
        unsafe { std::sync::atomic::AtomicI32::from_ptr(self.mask as *const c_int as *mut c_int) }
            .load(std::sync::atomic::Ordering::Relaxed) as u32 as u64
    }

    fn wants(&self, bits: u64) -> bool {
        self.ignore_mask || self.mask() & bits != 0
    }

    pub fn init(
        &self,
        id: u64,
        name: Option<&str>,
        nnodes: i32,
        nranks: i32,
        rank: i32,
    ) -> (Comm, c_int) {
        let name = name.map(|n| CString::new(n).unwrap_or_default());
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the plugin's init with NCCL's arguments.
        let rc = unsafe {
            (self.table.init)(
                &mut ctx,
                id,
                self.mask as *const c_int as *mut c_int,
                name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
                nnodes,
                nranks,
                rank,
                Some(logger()),
            )
        };
        (Comm { ctx, nnodes }, rc)
    }

    pub fn finalize(&self, comm: Comm) -> c_int {
        // SAFETY: the context init gave.
        unsafe { (self.table.finalize)(comm.ctx) }
    }

    fn start(&self, comm: Comm, d: &mut EventDescrV5, rcs: &mut Vec<c_int>) -> *mut c_void {
        let mut h = std::ptr::null_mut();
        // SAFETY: a descriptor laid out as NCCL's, alive for the call.
        rcs.push(unsafe { (self.table.start_event)(comm.ctx, &mut h, d) });
        h
    }

    fn stop(&self, h: *mut c_void, rcs: &mut Vec<c_int>) {
        // NCCL stops task events only when it has a handle; net plugins stop theirs always.
        // SAFETY: a handle the plugin gave (or NULL).
        rcs.push(unsafe { (self.table.stop_event)(h) });
    }

    /// The plugin's table, for calls this host does not make itself.
    pub fn table(&self) -> &'static ProfilerV5 {
        self.table
    }

    /// Only the operation's start event: its handle (NULL when the plugin gave none).
    pub fn start_task(&self, comm: Comm, p: &Prepared) -> (*mut c_void, c_int) {
        let mut rcs = Vec::new();
        let mut d = p.descr;
        let h = self.start(comm, &mut d, &mut rcs);
        (h, rcs[0])
    }

    /// `stopEvent` on any handle word: the plugin never dereferences handles, which is what
    /// the tests that pass it junk check.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn stop_handle(&self, h: *mut c_void) -> c_int {
        // SAFETY: the plugin must accept any handle word; that is what is being tested.
        unsafe { (self.table.stop_event)(h) }
    }

    /// One operation, as NCCL reports it. Returns every return code the plugin gave.
    pub fn op(&self, comm: Comm, op: &Op, net: Option<&Net>) -> Vec<c_int> {
        let mut rcs = Vec::new();
        self.run(comm, &Prepared::new(op), net, &mut rcs);
        rcs
    }

    /// Runs a prepared operation (no allocation here but `rcs` growing).
    pub fn run(&self, comm: Comm, p: &Prepared, net: Option<&Net>, rcs: &mut Vec<c_int>) {
        self.play(comm, p, net, rcs, false)
    }

    /// An operation that never finishes, as a hung collective looks to NCCL's profiler
    /// interface: its start and stop (the launch), its kernel channels started on the GPU
    /// and never stopped, its proxy operations posted and never done.
    pub fn run_stuck(&self, comm: Comm, p: &Prepared, net: Option<&Net>, rcs: &mut Vec<c_int>) {
        self.play(comm, p, net, rcs, true)
    }

    fn play(&self, comm: Comm, p: &Prepared, net: Option<&Net>, rcs: &mut Vec<c_int>, stuck: bool) {
        let op = &p.op;
        let type_ = p.descr.type_;
        if !self.wants(type_ | event::KERNEL_CH | event::NET_PLUGIN | event::PROXY_OP) {
            return;
        }
        let mut d = p.descr;
        if type_ == event::COLL {
            d.u.coll.seq_number = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let task = self.start(comm, &mut d, rcs);
        let t0 = GPU_CLOCK.with(|c| {
            let t = c.get();
            c.set(t + op.exec_ns + 1000);
            t
        });
        let per_channel = p.bytes / (op.channels.max(1) as usize);
        let kernel = self.wants(event::KERNEL_CH);
        for c in 0..op.channels {
            // SAFETY: all-zero is a valid descriptor (NULL pointers, zero counts).
            let mut k: EventDescrV5 = unsafe { std::mem::zeroed() };
            let mut kh = std::ptr::null_mut();
            if kernel {
                k.type_ = event::KERNEL_CH;
                k.parent_obj = task;
                k.u.kernel_ch = abi::KernelChDescr {
                    channel_id: c,
                    p_timer: t0 + c as u64,
                };
                kh = self.start(comm, &mut k, rcs);
            }
            if comm.nnodes > 1
                && let Some(net) = net
                && self.wants(event::NET_PLUGIN)
            {
                self.proxy_traffic(comm, task, net, per_channel, rcs, !stuck);
            }
            if kernel && !stuck {
                let mut args = StateArgs {
                    p_timer: t0 + op.exec_ns,
                };
                // SAFETY: the channel's handle and NCCL's kernel stop arguments.
                rcs.push(unsafe {
                    (self.table.record_event_state)(kh, abi::STATE_KERNEL_CH_STOP, &mut args)
                });
                if !kh.is_null() {
                    self.stop(kh, rcs);
                }
            }
        }
        if !task.is_null() {
            self.stop(task, rcs);
        }
    }

    /// A proxy operation and its network events for `bytes` sent by one channel: IB as
    /// 512 KiB RDMA writes plus a receive (no length), sockets as a send and a receive.
    /// `task` is the operation's handle, the proxy operation's parent as NCCL names it;
    /// `done`: the proxy operation stops (else it stays in flight).
    fn proxy_traffic(
        &self,
        comm: Comm,
        task: *mut c_void,
        net: &Net,
        bytes: usize,
        rcs: &mut Vec<c_int>,
        done: bool,
    ) {
        let mut p: EventDescrV5 = unsafe { std::mem::zeroed() };
        p.type_ = event::PROXY_OP;
        p.parent_obj = task;
        // SAFETY: getpid cannot fail.
        p.u.proxy_op.pid = unsafe { libc::getpid() };
        p.u.proxy_op.is_send = 1;
        let ph = self.start(comm, &mut p, rcs);
        let net_event = |id: i64, data: *mut c_void, rcs: &mut Vec<c_int>| {
            let mut n: EventDescrV5 = unsafe { std::mem::zeroed() };
            n.type_ = event::NET_PLUGIN;
            n.u.net_plugin = abi::NetPluginDescr { id, data };
            let h = self.start(comm, &mut n, rcs);
            self.stop(h, rcs);
        };
        match net {
            Net::Ib => {
                let mut left = bytes;
                while left > 0 {
                    let len = left.min(512 << 10);
                    let mut d = abi::NetIbDescrV1 {
                        type_: abi::NET_IB_QP,
                        qp: abi::NetIbQp {
                            device: 0,
                            wr_id: 1,
                            opcode: 1,
                            qp_num: 7,
                            length: len,
                        },
                    };
                    net_event(abi::NET_TYPE_IB | 1, &mut d as *mut _ as *mut c_void, rcs);
                    left -= len;
                }
                let mut recv = abi::NetIbDescrV1 {
                    type_: abi::NET_IB_QP,
                    qp: abi::NetIbQp {
                        device: 0,
                        wr_id: 2,
                        opcode: 0,
                        qp_num: 8,
                        length: 0,
                    },
                };
                net_event(
                    abi::NET_TYPE_IB | 1,
                    &mut recv as *mut _ as *mut c_void,
                    rcs,
                );
            }
            Net::Socket => {
                for op in [0, 1] {
                    let mut d = abi::NetSockDescrV1 {
                        type_: abi::NET_SOCK_SOCKET,
                        sock: abi::NetSock {
                            fd: 5,
                            op,
                            length: bytes,
                        },
                    };
                    net_event(abi::NET_TYPE_SOCK | 1, &mut d as *mut _ as *mut c_void, rcs);
                }
            }
            Net::Other(t) => net_event(((*t as i64) << 16) | 1, std::ptr::null_mut(), rcs),
            Net::Silent => {}
        }
        if done {
            self.stop(ph, rcs);
        }
    }
}

/// An operation's descriptor built once, with the strings it points at.
pub struct Prepared {
    op: Op,
    descr: EventDescrV5,
    bytes: usize,
    _strings: [CString; 4],
}

// SAFETY: the descriptor points only at the strings this value owns.
unsafe impl Send for Prepared {}
// SAFETY: as above; it is only read.
unsafe impl Sync for Prepared {}

impl Prepared {
    pub fn new(op: &Op) -> Prepared {
        let c = |s: &str| CString::new(s).unwrap_or_default();
        let strings = [c(&op.func), c(&op.datatype), c(&op.algo), c(&op.proto)];
        // SAFETY: all-zero is a valid descriptor.
        let mut d: EventDescrV5 = unsafe { std::mem::zeroed() };
        if op.is_p2p() {
            d.type_ = event::P2P;
            d.u.p2p = abi::P2pDescr {
                func: strings[0].as_ptr(),
                buff: std::ptr::null_mut(),
                datatype: strings[1].as_ptr(),
                count: op.count,
                peer: 1,
                n_channels: op.channels,
                parent_group: std::ptr::null_mut(),
            };
        } else {
            d.type_ = event::COLL;
            d.u.coll = abi::CollDescr {
                seq_number: 0,
                func: strings[0].as_ptr(),
                send_buff: std::ptr::null(),
                recv_buff: std::ptr::null_mut(),
                count: op.count,
                root: 0,
                datatype: strings[1].as_ptr(),
                n_channels: op.channels,
                n_warps: 16,
                algo: strings[2].as_ptr(),
                proto: strings[3].as_ptr(),
                parent_group: std::ptr::null_mut(),
            };
        }
        Prepared {
            bytes: op.count * crate::names::datatype_size(op.datatype.as_bytes()) as usize,
            op: op.clone(),
            descr: d,
            _strings: strings,
        }
    }
}
