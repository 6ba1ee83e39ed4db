//! NCCL's profiler plugin interface, versions 5 (NCCL 2.28) and 4 (NCCL 2.25 to 2.27), as
//! C layouts. Read from NCCL's `profiler_v5.h`, `profiler_v4.h`, `profiler_net.h`,
//! `net_ib_v1.h` and `net_socket_v1.h`; the offsets are pinned by the tests below against
//! what a C compiler gives for those headers on x86_64 and aarch64 Linux.
//!
//! Public so that the driver binary and the tests build descriptors exactly as NCCL does.

use std::ffi::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`; the plugin only ever returns `ncclSuccess`.
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;

/// `ncclDebugLogger_t`: NCCL's own logger, variadic like printf.
pub type Logger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);
/// `NCCL_LOG_INFO`.
pub const LOG_INFO: c_int = 3;
/// `NCCL_INIT`: in NCCL's default debug subsystems, so the plugin's lines show with
/// `NCCL_DEBUG=INFO` alone.
pub const LOG_SUBSYS_INIT: c_ulong = 0x1;

/// Event types (`ncclProfileColl`, ...): the bits of the activation mask and the `type` of
/// a descriptor.
pub mod event {
    pub const GROUP: u64 = 1 << 0;
    pub const COLL: u64 = 1 << 1;
    pub const P2P: u64 = 1 << 2;
    pub const PROXY_OP: u64 = 1 << 3;
    pub const PROXY_STEP: u64 = 1 << 4;
    pub const PROXY_CTRL: u64 = 1 << 5;
    pub const KERNEL_CH: u64 = 1 << 6;
    pub const NET_PLUGIN: u64 = 1 << 7;
    pub const GROUP_API: u64 = 1 << 8;
    pub const COLL_API: u64 = 1 << 9;
    pub const P2P_API: u64 = 1 << 10;
    pub const KERNEL_LAUNCH: u64 = 1 << 11;
}

/// `ncclProfilerKernelChStop`: the state that carries a channel's GPU stop timestamp.
pub const STATE_KERNEL_CH_STOP: c_int = 22;
/// `ncclProfilerNetPluginUpdate`.
pub const STATE_NET_PLUGIN_UPDATE: c_int = 21;

/// The network plugin id of a `NetPlugin` event: bits 16..32 the network type, the low 16
/// bits the version of its descriptor.
pub const NET_VER_MASK: i64 = 0xffff;
pub const NET_TYPE_MASK: i64 = 0xffff_0000;
pub const NET_TYPE_IB: i64 = 1 << 16;
pub const NET_TYPE_SOCK: i64 = 2 << 16;
/// `ncclProfileQp`, the IB plugin's one event type (descriptor version 1).
pub const NET_IB_QP: u8 = 1;
/// `ncclProfileSocket`, the socket plugin's one event type (descriptor version 1).
pub const NET_SOCK_SOCKET: u8 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApiDescr {
    pub graph_captured: bool,
    pub group_depth: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub root: c_int,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApiDescr {
    pub func: *const c_char,
    pub count: usize,
    pub datatype: *const c_char,
    pub stream: *mut c_void,
    pub graph_captured: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescr {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
    /// v5 only.
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pDescr {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
    /// v5 only.
    pub parent_group: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollDescrV4 {
    pub seq_number: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pDescrV4 {
    pub func: *const c_char,
    pub buff: *mut c_void,
    pub datatype: *const c_char,
    pub count: usize,
    pub peer: c_int,
    pub n_channels: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOpDescr {
    /// The process that created the proxy operation: with PXN another process's proxy
    /// thread may report it, and `parentObj` is then that process's pointer.
    pub pid: libc::pid_t,
    pub channel_id: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    pub chunk_size: c_int,
    pub is_send: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyStepDescr {
    pub step: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelChDescr {
    pub channel_id: u8,
    /// GPU global timer (ns) when the channel started the operation.
    pub p_timer: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetPluginDescr {
    pub id: i64,
    pub data: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrV5 {
    pub group_api: GroupApiDescr,
    pub coll_api: CollApiDescr,
    pub p2p_api: P2pApiDescr,
    pub kernel_launch: *mut c_void,
    pub coll: CollDescr,
    pub p2p: P2pDescr,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
    pub kernel_ch: KernelChDescr,
    pub net_plugin: NetPluginDescr,
}

/// `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV5 {
    pub type_: u64,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrV5,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrV4 {
    pub coll: CollDescrV4,
    pub p2p: P2pDescrV4,
    pub proxy_op: ProxyOpDescr,
    pub proxy_step: ProxyStepDescr,
    pub kernel_ch: KernelChDescr,
    pub net_plugin: NetPluginDescr,
}

/// `ncclProfilerEventDescr_v4_t`: the same events at the same offsets, with a one-byte type.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV4 {
    pub type_: u8,
    pub parent_obj: *mut c_void,
    pub rank: c_int,
    pub u: DescrV4,
}

/// `ncclProfilerEventStateArgs_v5_t` (and v4, identical): one 8-byte field per event kind.
#[repr(C)]
#[derive(Clone, Copy)]
pub union StateArgs {
    pub trans_size: usize,
    pub appended_proxy_ops: c_int,
    pub net_data: *mut c_void,
    /// GPU global timer (ns) when the channel finished, with `STATE_KERNEL_CH_STOP`.
    pub p_timer: u64,
}

/// `ncclProfilerNetIbDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetIbDescrV1 {
    pub type_: u8,
    pub qp: NetIbQp,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetIbQp {
    pub device: c_int,
    pub wr_id: u64,
    pub opcode: c_int,
    pub qp_num: c_int,
    /// Bytes of the work request; NCCL fills it for sends only.
    pub length: usize,
}

/// `ncclProfilerNetSockDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetSockDescrV1 {
    pub type_: u8,
    pub sock: NetSock,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetSock {
    pub fd: c_int,
    pub op: c_int,
    pub length: usize,
}

pub type InitV5 = unsafe extern "C" fn(
    context: *mut *mut c_void,
    comm_id: u64,
    activation_mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<Logger>,
) -> NcclResult;
pub type InitV4 = unsafe extern "C" fn(
    context: *mut *mut c_void,
    activation_mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Option<Logger>,
) -> NcclResult;
pub type StartEventV5 = unsafe extern "C" fn(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescrV5,
) -> NcclResult;
pub type StartEventV4 = unsafe extern "C" fn(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut EventDescrV4,
) -> NcclResult;
pub type StopEvent = unsafe extern "C" fn(handle: *mut c_void) -> NcclResult;
pub type RecordEventState =
    unsafe extern "C" fn(handle: *mut c_void, state: c_int, args: *mut StateArgs) -> NcclResult;
pub type Finalize = unsafe extern "C" fn(context: *mut c_void) -> NcclResult;

/// `ncclProfiler_v5_t`.
#[repr(C)]
pub struct ProfilerV5 {
    pub name: *const c_char,
    pub init: InitV5,
    pub start_event: StartEventV5,
    pub stop_event: StopEvent,
    pub record_event_state: RecordEventState,
    pub finalize: Finalize,
}

/// `ncclProfiler_v4_t`.
#[repr(C)]
pub struct ProfilerV4 {
    pub name: *const c_char,
    pub init: InitV4,
    pub start_event: StartEventV4,
    pub stop_event: StopEvent,
    pub record_event_state: RecordEventState,
    pub finalize: Finalize,
}

// SAFETY: the tables are immutable after link time; `name` points at a static string.
unsafe impl Sync for ProfilerV5 {}
// SAFETY: as above.
unsafe impl Sync for ProfilerV4 {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets a C compiler gives for NCCL's headers (x86_64 and aarch64 Linux, LP64).
    #[test]
    fn layouts_match_nccls_headers() {
        assert_eq!(size_of::<EventDescrV5>(), 112);
        assert_eq!(size_of::<EventDescrV4>(), 104);
        assert_eq!(offset_of!(EventDescrV5, parent_obj), 8);
        assert_eq!(offset_of!(EventDescrV5, rank), 16);
        assert_eq!(offset_of!(EventDescrV5, u), 24);
        assert_eq!(offset_of!(EventDescrV4, u), 24);
        assert_eq!(24 + offset_of!(CollDescr, count), 56);
        assert_eq!(24 + offset_of!(CollDescr, datatype), 72);
        assert_eq!(24 + offset_of!(CollDescr, n_channels), 80);
        assert_eq!(24 + offset_of!(CollDescr, algo), 88);
        assert_eq!(24 + offset_of!(CollDescr, proto), 96);
        assert_eq!(24 + offset_of!(CollDescr, parent_group), 104);
        assert_eq!(24 + offset_of!(CollDescrV4, proto), 96);
        assert_eq!(24 + offset_of!(P2pDescr, count), 48);
        assert_eq!(24 + offset_of!(P2pDescr, peer), 56);
        assert_eq!(24 + offset_of!(P2pDescr, n_channels), 60);
        assert_eq!(24 + offset_of!(P2pDescrV4, n_channels), 60);
        assert_eq!(24 + offset_of!(KernelChDescr, p_timer), 32);
        assert_eq!(24 + offset_of!(NetPluginDescr, data), 32);
        assert_eq!(24 + offset_of!(ProxyOpDescr, is_send), 44);
        assert_eq!(size_of::<NetIbDescrV1>(), 40);
        assert_eq!(
            offset_of!(NetIbDescrV1, qp) + offset_of!(NetIbQp, length),
            32
        );
        assert_eq!(size_of::<NetSockDescrV1>(), 24);
        assert_eq!(
            offset_of!(NetSockDescrV1, sock) + offset_of!(NetSock, length),
            16
        );
        assert_eq!(size_of::<StateArgs>(), 8);
    }
}
