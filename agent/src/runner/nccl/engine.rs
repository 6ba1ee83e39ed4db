//! The GPU side: NCCL communicators over cudarc, device buffers, and the timed loops.
//!
//! Buffers are raw device pointers allocated once at the largest size, and every call
//! goes straight to `ncclAllReduce` & co. on our own non-blocking streams, so nothing
//! between two launches (no event tracking, no allocation) shows up in small-size latency.
//! Test data is written and checked on the GPU (`gpu.rs`); how the loops are timed is
//! `timing.rs`.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, result as cu, sys as cusys};
use cudarc::nccl::{result as nc, sys as ncsys};

use super::check;
use super::gpu::Kernels;
use super::spec::{Collective, Counts, Dtype, RedOp};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("CUDA: {what}: {err:?}")]
    Cuda { what: String, err: cu::DriverError },
    #[error("NCCL: {what}: {err:?}")]
    Nccl { what: String, err: nc::NcclError },
    #[error("{0}")]
    Setup(String),
}

fn cuda<T>(what: impl Into<String>, r: Result<T, cu::DriverError>) -> Result<T, EngineError> {
    r.map_err(|err| EngineError::Cuda {
        what: what.into(),
        err,
    })
}

fn nccl<T>(what: impl Into<String>, r: Result<T, nc::NcclError>) -> Result<T, EngineError> {
    r.map_err(|err| EngineError::Nccl {
        what: what.into(),
        err,
    })
}

/// The ranks this process drives: local devices `devices`, global ranks
/// `first_rank..first_rank + devices.len()` out of `nranks`.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub devices: Vec<usize>,
    pub first_rank: usize,
    pub nranks: usize,
}

struct Rank {
    ctx: Arc<CudaContext>,
    stream: cusys::CUstream,
    comm: ncsys::ncclComm_t,
    rank: usize,
    send: cusys::CUdeviceptr,
    recv: cusys::CUdeviceptr,
    /// 8 bytes where the check kernels count wrong elements.
    counter: cusys::CUdeviceptr,
    kernels: Option<Kernels>,
}

impl Rank {
    /// A context, a stream, the two buffers, the counter and the kernels on `dev`.
    fn set_up(dev: usize, rank: usize, capacity: usize) -> Result<Rank, EngineError> {
        let ctx = cuda(format!("context on GPU {dev}"), CudaContext::new(dev))?;
        // SAFETY: we never use cudarc's tracked slices, only raw pointers.
        unsafe { ctx.disable_event_tracking() };
        cuda("bind context", ctx.bind_to_thread())?;
        let stream = cuda(
            "stream",
            cu::stream::create(cu::stream::StreamKind::NonBlocking),
        )?;
        let bytes = capacity.max(1);
        // SAFETY: plain allocations on the bound context, freed in Engine's Drop.
        let send = cuda(format!("allocating {bytes} B on GPU {dev}"), unsafe {
            cu::malloc_sync(bytes)
        })?;
        let recv = cuda(format!("allocating {bytes} B on GPU {dev}"), unsafe {
            cu::malloc_sync(bytes)
        })?;
        // SAFETY: as above.
        let counter = cuda("allocating a counter", unsafe { cu::malloc_sync(8) })?;
        let kernels = cuda(
            format!("loading the check kernels on GPU {dev}"),
            Kernels::load(dev),
        )?;
        Ok(Rank {
            ctx,
            stream,
            comm: std::ptr::null_mut(),
            rank,
            send,
            recv,
            counter,
            kernels: Some(kernels),
        })
    }
}

pub struct Engine {
    ranks: Vec<Rank>,
    nranks: usize,
    capacity: usize,
    nccl_init: Duration,
}

/// What one launch does: the collective, its data type, reduction and root.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    pub coll: Collective,
    pub dtype: Dtype,
    pub op: RedOp,
    pub root: usize,
}

/// One CUDA graph per local rank, each holding the same captured launches.
pub struct Graphs {
    execs: Vec<(cusys::CUgraph, cusys::CUgraphExec)>,
}

/// NCCL's version code (e.g. 22803 for 2.28.3), as nccl-tests prints it.
pub fn nccl_version_code() -> Result<i32, EngineError> {
    nccl("ncclGetVersion", nc::get_nccl_version())
}

pub fn nccl_version() -> Result<String, EngineError> {
    let v = nccl_version_code()?;
    // Since 2.9 the code is major*10000 + minor*100 + patch.
    Ok(if v >= 20900 {
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100)
    })
}

pub fn new_unique_id() -> Result<[u8; 128], EngineError> {
    let id = nccl("ncclGetUniqueId", nc::get_uniqueid())?;
    Ok(id.internal.map(|c| c as u8))
}

impl Engine {
    /// Creates the communicators and allocates `capacity` bytes per buffer per rank.
    /// `unique_id` is needed when other processes hold ranks too.
    pub fn new(
        topo: &Topology,
        unique_id: Option<[u8; 128]>,
        capacity: usize,
    ) -> Result<Engine, EngineError> {
        cuda("cuInit", cu::init())?;
        let count = cuda("cuDeviceGetCount", cu::device::get_count())? as usize;
        if let Some(bad) = topo.devices.iter().find(|&&d| d >= count) {
            return Err(EngineError::Setup(format!(
                "GPU {bad} requested but this node has {count} CUDA device(s)"
            )));
        }
        let single_process = topo.first_rank == 0 && topo.devices.len() == topo.nranks;
        let mut ranks;
        let nccl_init;
        if single_process && unique_id.is_none() {
            let devs: Vec<i32> = topo.devices.iter().map(|&d| d as i32).collect();
            // NCCL's set-up and ours (contexts, buffers, the kernels' JIT compile) need
            // nothing from each other, so they run at the same time.
            let (set_up, init) = std::thread::scope(|s| {
                let init = s.spawn(|| {
                    let started = Instant::now();
                    let mut comms = vec![std::ptr::null_mut(); devs.len()];
                    // SAFETY: comms has one slot per device in devs.
                    let res = unsafe {
                        nc::comm_init_all(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr())
                    };
                    // Handles cross the thread as addresses (raw pointers are not Send).
                    let comms: Vec<usize> = comms.into_iter().map(|c| c as usize).collect();
                    (res.map(|_| comms), started.elapsed())
                });
                let set_up: Result<Vec<Rank>, EngineError> = topo
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, &dev)| Rank::set_up(dev, topo.first_rank + i, capacity))
                    .collect();
                (set_up, init.join())
            });
            let (comms, took) = init.map_err(|_| {
                EngineError::Setup("the thread creating the communicators panicked".into())
            })?;
            ranks = set_up?;
            let comms = nccl("ncclCommInitAll", comms)?;
            for (r, c) in ranks.iter_mut().zip(comms) {
                r.comm = c as ncsys::ncclComm_t;
            }
            nccl_init = took;
        } else {
            let raw = unique_id.ok_or_else(|| {
                EngineError::Setup("ranks in several processes need an NCCL unique id".into())
            })?;
            let id = ncsys::ncclUniqueId {
                internal: raw.map(|b| b as std::ffi::c_char),
            };
            ranks = topo
                .devices
                .iter()
                .enumerate()
                .map(|(i, &dev)| Rank::set_up(dev, topo.first_rank + i, capacity))
                .collect::<Result<Vec<_>, _>>()?;
            let started = Instant::now();
            nccl("ncclGroupStart", nc::group_start())?;
            for r in ranks.iter_mut() {
                cuda("bind context", r.ctx.bind_to_thread())?;
                let mut comm = std::ptr::null_mut();
                // SAFETY: comm is a valid out-pointer; the id is the one rank 0 created.
                let res =
                    unsafe { nc::comm_init_rank(&mut comm, topo.nranks as i32, id, r.rank as i32) };
                nccl(format!("ncclCommInitRank (rank {})", r.rank), res)?;
                r.comm = comm;
            }
            nccl("ncclGroupEnd (init)", nc::group_end())?;
            nccl_init = started.elapsed();
        }
        Ok(Engine {
            ranks,
            nranks: topo.nranks,
            capacity,
            nccl_init,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How long creating the communicators took.
    pub fn nccl_init_time(&self) -> Duration {
        self.nccl_init
    }

    /// Fails when a size does not fit the buffers allocated at start.
    pub fn fits(&self, dtype: Dtype, c: &Counts) -> Result<(), EngineError> {
        if c.send.max(c.recv) * dtype.size() > self.capacity {
            return Err(EngineError::Setup(format!(
                "{} B does not fit the {} B buffers",
                c.bytes, self.capacity
            )));
        }
        Ok(())
    }

    /// Issues one collective on every local rank (grouped when there are several).
    ///
    /// Launch `iter` works on the `iter`-th window of the buffers, as nccl-tests does, so
    /// sizes that fit in the L2 cache are not timed on data the previous launch left there
    /// (launch 0 is the validated one).
    pub fn launch(
        &self,
        k: &Case,
        c: &Counts,
        in_place: bool,
        iter: u64,
    ) -> Result<(), EngineError> {
        let window = (c.send.max(c.recv) * k.dtype.size()) as u64;
        let windows = (self.capacity as u64)
            .checked_div(window)
            .unwrap_or(1)
            .max(1);
        let shift = window * (iter % windows);
        let grouped = self.ranks.len() > 1;
        if grouped {
            nccl("ncclGroupStart", nc::group_start())?;
        }
        for r in &self.ranks {
            self.launch_one(r, k, c, in_place, shift)?;
        }
        if grouped {
            nccl("ncclGroupEnd", nc::group_end())?;
        }
        Ok(())
    }

    fn launch_one(
        &self,
        r: &Rank,
        k: &Case,
        c: &Counts,
        in_place: bool,
        shift: u64,
    ) -> Result<(), EngineError> {
        let (coll, root) = (k.coll, k.root);
        let es = k.dtype.size() as u64;
        let dt = nccl_dtype(k.dtype);
        let rop = nccl_op(k.op);
        let stream = r.stream as ncsys::cudaStream_t;
        let (mut send, mut recv) = (r.send + shift, r.recv + shift);
        if in_place {
            send = recv;
            match coll {
                Collective::AllGather => send = recv + r.rank as u64 * c.param as u64 * es,
                Collective::ReduceScatter => recv += r.rank as u64 * c.param as u64 * es,
                _ => {}
            }
        }
        let (sp, rp) = (send as *const c_void, recv as *mut c_void);
        let n = self.nranks;
        // SAFETY: both buffers hold `capacity` bytes, and a window never reaches past them
        // (Counts are checked by `fits`); the communicator and stream belong to this rank.
        let res = unsafe {
            match coll {
                Collective::AllReduce => nc::all_reduce(sp, rp, c.param, dt, rop, r.comm, stream),
                Collective::AllGather => nc::all_gather(sp, rp, c.param, dt, r.comm, stream),
                Collective::ReduceScatter => {
                    nc::reduce_scatter(sp, rp, c.param, dt, rop, r.comm, stream)
                }
                Collective::Broadcast => {
                    nc::broadcast(sp, rp, c.param, dt, root as i32, r.comm, stream)
                }
                Collective::Reduce => {
                    nc::reduce(sp, rp, c.param, dt, rop, root as i32, r.comm, stream)
                }
                Collective::AllToAll => {
                    nccl("ncclGroupStart", nc::group_start())?;
                    for p in 0..n {
                        let off = p as u64 * c.param as u64 * es;
                        nccl(
                            "ncclSend",
                            nc::send(
                                (send + off) as *const c_void,
                                c.param,
                                dt,
                                p as i32,
                                r.comm,
                                stream,
                            ),
                        )?;
                        nccl(
                            "ncclRecv",
                            nc::recv(
                                (recv + off) as *mut c_void,
                                c.param,
                                dt,
                                p as i32,
                                r.comm,
                                stream,
                            ),
                        )?;
                    }
                    nc::group_end()
                }
                Collective::SendRecv => {
                    let next = ((r.rank + 1) % n) as i32;
                    let prev = ((r.rank + n - 1) % n) as i32;
                    nccl("ncclGroupStart", nc::group_start())?;
                    nccl("ncclSend", nc::send(sp, c.param, dt, next, r.comm, stream))?;
                    nccl("ncclRecv", nc::recv(rp, c.param, dt, prev, r.comm, stream))?;
                    nc::group_end()
                }
            }
        };
        nccl(coll.name(), res).map(|_| ())
    }

    pub fn sync(&self) -> Result<(), EngineError> {
        for r in &self.ranks {
            // SAFETY: the stream is ours and alive.
            cuda("cuStreamSynchronize", unsafe {
                cu::stream::synchronize(r.stream)
            })?;
        }
        Ok(())
    }

    /// Writes every local rank's input pattern and, when `check`, runs the collective once
    /// and counts the wrong elements of its output, all on the GPU: only the count comes
    /// back. The inputs are written either way, so the timed loops never run on zeros.
    pub fn validate(
        &self,
        k: &Case,
        c: &Counts,
        in_place: bool,
        check: bool,
    ) -> Result<Option<u64>, EngineError> {
        self.fits(k.dtype, c)?;
        let check = check && (!in_place || k.coll.checked_in_place());
        let es = k.dtype.size();
        let total = c.send.max(c.recv) * es;
        for r in &self.ranks {
            cuda("bind context", r.ctx.bind_to_thread())?;
            let kernels = r
                .kernels
                .as_ref()
                .expect("kernels live as long as the rank");
            let target = if in_place { r.recv } else { r.send };
            // SAFETY: every region is within the `capacity` bytes of its buffer (checked by
            // `fits`); all work is on this rank's stream, in order.
            unsafe {
                if check {
                    // Nothing in the pattern is 0, so an output left untouched is wrong.
                    let out = if in_place { total } else { c.recv * es };
                    cuda(
                        "cuMemsetD8Async",
                        cu::memset_d8_async(r.recv, 0, out, r.stream),
                    )?;
                }
                for seg in check::input_segments(k.coll, k.dtype, k.op, r.rank, c, in_place) {
                    cuda("filling the input", kernels.fill(r.stream, target, &seg))?;
                }
            }
        }
        if !check {
            self.sync()?;
            return Ok(None);
        }
        self.launch(k, c, in_place, 0)?;
        let tol = check::tolerance(k.dtype, k.op);
        for r in &self.ranks {
            cuda("bind context", r.ctx.bind_to_thread())?;
            let kernels = r
                .kernels
                .as_ref()
                .expect("kernels live as long as the rank");
            let mut out = r.recv;
            if in_place && k.coll == Collective::ReduceScatter {
                out += (r.rank * c.param * es) as u64;
            }
            let segs =
                check::expected_segments(k.coll, k.dtype, k.op, r.rank, self.nranks, k.root, c);
            // SAFETY: as above; the counter is 8 bytes of this rank's context.
            unsafe {
                cuda(
                    "cuMemsetD8Async",
                    cu::memset_d8_async(r.counter, 0, 8, r.stream),
                )?;
                for seg in &segs {
                    cuda(
                        "counting wrong elements",
                        kernels.count(r.stream, out, seg, k.dtype, tol, r.counter),
                    )?;
                }
            }
        }
        self.sync()?;
        let mut wrong = 0;
        for r in &self.ranks {
            cuda("bind context", r.ctx.bind_to_thread())?;
            let mut n = [0u64; 1];
            // SAFETY: the stream that wrote the counter was synchronized.
            cuda("reading the count", unsafe {
                cu::memcpy_dtoh_sync(&mut n, r.counter)
            })?;
            wrong += n[0];
        }
        Ok(Some(wrong))
    }

    /// Captures `iters` launches into one CUDA graph per local rank (nccl-tests' `-G`).
    pub fn capture(
        &self,
        k: &Case,
        c: &Counts,
        in_place: bool,
        iters: u64,
    ) -> Result<Graphs, EngineError> {
        use cusys::CUstreamCaptureMode as M;
        for r in &self.ranks {
            // SAFETY: our stream; capture ends below on every path that began it.
            cuda("cuStreamBeginCapture", unsafe {
                cu::stream::begin_capture(r.stream, M::CU_STREAM_CAPTURE_MODE_GLOBAL)
            })?;
        }
        let mut launched = Ok(());
        for i in 0..iters {
            launched = self.launch(k, c, in_place, i);
            if launched.is_err() {
                break;
            }
        }
        let mut graphs = Graphs { execs: Vec::new() };
        let mut ended = Ok(());
        for r in &self.ranks {
            // SAFETY: capture was begun on this stream above.
            match unsafe { cu::stream::end_capture(r.stream) } {
                Ok(g) => graphs.execs.push((g, std::ptr::null_mut())),
                Err(e) => ended = cuda("cuStreamEndCapture", Err(e)),
            }
        }
        launched?;
        ended?;
        for (r, (g, exec)) in self.ranks.iter().zip(graphs.execs.iter_mut()) {
            cuda("bind context", r.ctx.bind_to_thread())?;
            // SAFETY: a graph just captured on this context.
            *exec = cuda("cuGraphInstantiate", unsafe {
                cu::graph::instantiate(*g, cusys::CUgraphInstantiate_flags(0))
            })?;
        }
        Ok(graphs)
    }

    /// Launches every rank's graph once on its stream.
    pub fn replay(&self, g: &Graphs) -> Result<(), EngineError> {
        for (r, (_, exec)) in self.ranks.iter().zip(&g.execs) {
            // SAFETY: an instantiated graph of this rank, launched on its stream.
            cuda("cuGraphLaunch", unsafe {
                cu::graph::launch(*exec, r.stream)
            })?;
        }
        Ok(())
    }
}

impl Drop for Graphs {
    fn drop(&mut self) {
        for (g, exec) in self.execs.drain(..) {
            // SAFETY: each was created once by `capture` and is destroyed once here.
            unsafe {
                if !exec.is_null() {
                    let _ = cu::graph::exec_destroy(exec);
                }
                let _ = cu::graph::destroy(g);
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for r in &mut self.ranks {
            if r.ctx.bind_to_thread().is_err() {
                continue;
            }
            drop(r.kernels.take());
            // SAFETY: each resource was created by us and is released once.
            unsafe {
                if !r.comm.is_null() {
                    let _ = nc::comm_destroy(r.comm);
                }
                let _ = cu::free_sync(r.send);
                let _ = cu::free_sync(r.recv);
                let _ = cu::free_sync(r.counter);
                let _ = cu::stream::destroy(r.stream);
            }
        }
    }
}

fn nccl_dtype(d: Dtype) -> ncsys::ncclDataType_t {
    use ncsys::ncclDataType_t as T;
    match d {
        Dtype::Int8 => T::ncclInt8,
        Dtype::Uint8 => T::ncclUint8,
        Dtype::Int32 => T::ncclInt32,
        Dtype::Uint32 => T::ncclUint32,
        Dtype::Int64 => T::ncclInt64,
        Dtype::Uint64 => T::ncclUint64,
        Dtype::Half => T::ncclFloat16,
        Dtype::Float => T::ncclFloat32,
        Dtype::Double => T::ncclFloat64,
        Dtype::Bfloat16 => T::ncclBfloat16,
    }
}

fn nccl_op(o: RedOp) -> ncsys::ncclRedOp_t {
    use ncsys::ncclRedOp_t as O;
    match o {
        RedOp::Sum => O::ncclSum,
        RedOp::Prod => O::ncclProd,
        RedOp::Max => O::ncclMax,
        RedOp::Min => O::ncclMin,
        RedOp::Avg => O::ncclAvg,
    }
}
