//! The GPU side: NCCL communicators over cudarc, device buffers, and the timed loops.
//!
//! Buffers are raw device pointers allocated once at the largest size, and every call
//! goes straight to `ncclAllReduce` & co. on our own non-blocking streams, so nothing
//! between two launches (no event tracking, no allocation) shows up in small-size latency.
//! Timing is as nccl-tests: host clock around `iters` launches and a stream sync, divided
//! by `iters`.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, result as cu, sys as cusys};
use cudarc::nccl::{result as nc, sys as ncsys};

use super::check;
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
}

pub struct Engine {
    ranks: Vec<Rank>,
    nranks: usize,
    capacity: usize,
}

/// One timed measurement of one size in one mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub time_us: f64,
    /// Elements that failed validation on this process's ranks; `None` when not checked.
    pub wrong: Option<u64>,
}

pub fn nccl_version() -> Result<String, EngineError> {
    let v = nccl("ncclGetVersion", nc::get_nccl_version())?;
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
        let mut ranks = Vec::new();
        for (i, &dev) in topo.devices.iter().enumerate() {
            let ctx = cuda(format!("context on GPU {dev}"), CudaContext::new(dev))?;
            // SAFETY: we never use cudarc's tracked slices, only raw pointers.
            unsafe { ctx.disable_event_tracking() };
            cuda("bind context", ctx.bind_to_thread())?;
            let stream = cuda(
                "stream",
                cu::stream::create(cu::stream::StreamKind::NonBlocking),
            )?;
            let bytes = capacity.max(1);
            // SAFETY: plain allocations on the bound context, freed in Drop.
            let send = cuda(format!("allocating {bytes} B on GPU {dev}"), unsafe {
                cu::malloc_sync(bytes)
            })?;
            let recv = cuda(format!("allocating {bytes} B on GPU {dev}"), unsafe {
                cu::malloc_sync(bytes)
            })?;
            ranks.push(Rank {
                ctx,
                stream,
                comm: std::ptr::null_mut(),
                rank: topo.first_rank + i,
                send,
                recv,
            });
        }
        let single_process = topo.first_rank == 0 && topo.devices.len() == topo.nranks;
        if single_process && unique_id.is_none() {
            let mut comms = vec![std::ptr::null_mut(); ranks.len()];
            let devs: Vec<i32> = topo.devices.iter().map(|&d| d as i32).collect();
            // SAFETY: comms has one slot per device in devs.
            nccl("ncclCommInitAll", unsafe {
                nc::comm_init_all(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr())
            })?;
            for (r, c) in ranks.iter_mut().zip(comms) {
                r.comm = c;
            }
        } else {
            let raw = unique_id.ok_or_else(|| {
                EngineError::Setup("ranks in several processes need an NCCL unique id".into())
            })?;
            let id = ncsys::ncclUniqueId {
                internal: raw.map(|b| b as std::ffi::c_char),
            };
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
        }
        Ok(Engine {
            ranks,
            nranks: topo.nranks,
            capacity,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Issues one collective on every local rank (grouped when there are several).
    fn launch(
        &self,
        coll: Collective,
        dtype: Dtype,
        op: RedOp,
        root: usize,
        c: &Counts,
        in_place: bool,
    ) -> Result<(), EngineError> {
        let grouped = self.ranks.len() > 1;
        if grouped {
            nccl("ncclGroupStart", nc::group_start())?;
        }
        for r in &self.ranks {
            self.launch_one(r, coll, dtype, op, root, c, in_place)?;
        }
        if grouped {
            nccl("ncclGroupEnd", nc::group_end())?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_one(
        &self,
        r: &Rank,
        coll: Collective,
        dtype: Dtype,
        op: RedOp,
        root: usize,
        c: &Counts,
        in_place: bool,
    ) -> Result<(), EngineError> {
        let es = dtype.size() as u64;
        let dt = nccl_dtype(dtype);
        let rop = nccl_op(op);
        let stream = r.stream as ncsys::cudaStream_t;
        let (mut send, mut recv) = (r.send, r.recv);
        if in_place {
            send = r.recv;
            match coll {
                Collective::AllGather => send = r.recv + r.rank as u64 * c.param as u64 * es,
                Collective::ReduceScatter => recv = r.recv + r.rank as u64 * c.param as u64 * es,
                _ => {}
            }
        }
        let (sp, rp) = (send as *const c_void, recv as *mut c_void);
        let n = self.nranks;
        // SAFETY: both buffers hold at least `capacity` bytes, and Counts never exceed it
        // (checked by `measure`); the communicator and stream belong to this rank.
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

    fn sync(&self) -> Result<(), EngineError> {
        for r in &self.ranks {
            // SAFETY: the stream is ours and alive.
            cuda("cuStreamSynchronize", unsafe {
                cu::stream::synchronize(r.stream)
            })?;
        }
        Ok(())
    }

    /// Warm-up, timed loop, then (when `check`) one validated run on fresh data.
    #[allow(clippy::too_many_arguments)]
    pub fn measure(
        &self,
        coll: Collective,
        dtype: Dtype,
        op: RedOp,
        root: usize,
        c: &Counts,
        in_place: bool,
        warmup: u64,
        iters: u64,
        check: bool,
    ) -> Result<Timing, EngineError> {
        let es = dtype.size();
        if c.send.max(c.recv) * es > self.capacity {
            return Err(EngineError::Setup(format!(
                "{} B does not fit the {} B buffers",
                c.bytes, self.capacity
            )));
        }
        for _ in 0..warmup {
            self.launch(coll, dtype, op, root, c, in_place)?;
        }
        self.sync()?;
        let start = Instant::now();
        for _ in 0..iters {
            self.launch(coll, dtype, op, root, c, in_place)?;
        }
        self.sync()?;
        let time_us = start.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
        let wrong = if check {
            Some(self.validate(coll, dtype, op, root, c, in_place)?)
        } else {
            None
        };
        Ok(Timing { time_us, wrong })
    }

    fn validate(
        &self,
        coll: Collective,
        dtype: Dtype,
        op: RedOp,
        root: usize,
        c: &Counts,
        in_place: bool,
    ) -> Result<u64, EngineError> {
        let es = dtype.size();
        let total = c.send.max(c.recv) * es;
        for r in &self.ranks {
            cuda("bind context", r.ctx.bind_to_thread())?;
            let mut host = vec![0u8; if in_place { total } else { c.send * es }];
            for seg in check::input_segments(coll, dtype, op, r.rank, c, in_place) {
                check::fill(&mut host, &seg);
            }
            let target = if in_place { r.recv } else { r.send };
            // SAFETY: host.len() <= capacity; synchronous copies on the bound context.
            unsafe {
                if !in_place {
                    cuda("cuMemsetD8", cu::memset_d8_sync(r.recv, 0, c.recv * es))?;
                }
                cuda("cuMemcpyHtoD", cu::memcpy_htod_sync(target, &host))?;
            }
            // A pageable copy or a memset may still be in flight when the call returns, and
            // our non-blocking stream does not wait for the legacy stream they ran on.
            cuda("cuCtxSynchronize", r.ctx.synchronize())?;
        }
        self.launch(coll, dtype, op, root, c, in_place)?;
        self.sync()?;
        let mut wrong = 0;
        for r in &self.ranks {
            cuda("bind context", r.ctx.bind_to_thread())?;
            let segs = check::expected_segments(coll, dtype, op, r.rank, self.nranks, root, c);
            if segs.is_empty() {
                continue;
            }
            let out_len = match coll {
                Collective::ReduceScatter => c.param,
                _ => c.recv,
            };
            let mut out = vec![0u8; out_len * es];
            let mut from = r.recv;
            if in_place && coll == Collective::ReduceScatter {
                from += r.rank as u64 * c.param as u64 * es as u64;
            }
            // SAFETY: reading within the buffer after the stream was synchronized.
            cuda("cuMemcpyDtoH", unsafe {
                cu::memcpy_dtoh_sync(&mut out, from)
            })?;
            wrong += check::count_wrong(&out, dtype, &segs, check::tolerance(dtype, op));
        }
        Ok(wrong)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        for r in &self.ranks {
            if r.ctx.bind_to_thread().is_err() {
                continue;
            }
            // SAFETY: each resource was created by us and is released once.
            unsafe {
                if !r.comm.is_null() {
                    let _ = nc::comm_destroy(r.comm);
                }
                let _ = cu::free_sync(r.send);
                let _ = cu::free_sync(r.recv);
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
