//! The CUDA side of `p2p`: contexts, peer access, buffers and the timed copy loops.
//!
//! Device buffers are `cuMemAlloc` allocations, not cudarc's `CudaSlice`: on drivers with
//! stream-ordered allocation cudarc takes its slices from a memory pool, and peer access
//! granted by `cuCtxEnablePeerAccess` covers `cuMemAlloc` memory only (a pool needs
//! `cuMemPoolSetAccess`), so a pool slice would silently turn a direct copy into a staged
//! one. Contexts, streams, pinned host memory and device names come from cudarc's safe API.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream, PinnedHostSlice, result as cu, sys as cusys};

use super::Path;

#[derive(Debug, thiserror::Error)]
#[error("CUDA: {what}: {err}")]
pub struct GpuError {
    pub what: String,
    pub err: cu::DriverError,
}

fn cuda<T>(what: impl Into<String>, r: Result<T, cu::DriverError>) -> Result<T, GpuError> {
    r.map_err(|err| GpuError {
        what: what.into(),
        err,
    })
}

/// Why CUDA cannot be used here, or the number of devices. Never panics: cudarc's loader
/// does when libcuda is missing, so its presence is checked first.
pub fn probe() -> Result<usize, String> {
    // SAFETY: only dlopen attempts on candidate names.
    if !unsafe { cusys::is_culib_present() } {
        return Err(
            "CUDA unavailable: libcuda.so not found (is the NVIDIA driver installed?)".into(),
        );
    }
    cu::init().map_err(|e| format!("CUDA unavailable: cuInit failed: {e}"))?;
    match cu::device::get_count() {
        Ok(0) => Err("CUDA unavailable: the driver reports no device".into()),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(format!("CUDA unavailable: cuDeviceGetCount failed: {e}")),
    }
}

/// The driver's CUDA version as "major.minor".
pub fn driver_version() -> Option<String> {
    let mut v = 0i32;
    // SAFETY: writes one int.
    unsafe { cusys::cuDriverGetVersion(&mut v) }.result().ok()?;
    Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// A `cuMemAlloc` allocation, freed in its own context.
struct DevBuf {
    ctx: Arc<CudaContext>,
    ptr: cusys::CUdeviceptr,
}

impl DevBuf {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DevBuf, GpuError> {
        cuda("bind context", ctx.bind_to_thread())?;
        // SAFETY: a plain allocation on the bound context, freed in Drop.
        let ptr = cuda(
            format!("allocating {bytes} B on GPU {}", ctx.ordinal()),
            unsafe { cu::malloc_sync(bytes) },
        )?;
        Ok(DevBuf {
            ctx: ctx.clone(),
            ptr,
        })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context; every stream using it was
            // synchronised before the measurement returned.
            let _ = unsafe { cu::free_sync(self.ptr) };
        }
    }
}

pub struct Gpu {
    pub index: usize,
    pub name: String,
    pub pci_bus_id: Option<i32>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    src: DevBuf,
    dst: DevBuf,
    host: PinnedHostSlice<u8>,
}

/// The byte a GPU's source buffer is filled with (never 0, distinct for 255 GPUs).
pub fn pattern(gpu: usize) -> u8 {
    ((gpu * 37 + 0x5b) % 255 + 1) as u8
}
/// What the pinned host buffer holds before the host-to-device copy.
pub const HOST_PATTERN: u8 = 0xc3;
/// How many bytes at each end of a destination are read back and checked.
const CHECK_BYTES: usize = 1 << 20;

pub struct Bench {
    pub gpus: Vec<Gpu>,
    /// `access[i][j]`: the context of `gpus[i]` maps `gpus[j]`'s memory (peer access on).
    pub access: Vec<Vec<bool>>,
    size: usize,
    warmup: u64,
    iters: u64,
}

impl Bench {
    pub fn new(devices: &[usize], size: usize, warmup: u64, iters: u64) -> Result<Bench, GpuError> {
        let mut gpus = Vec::new();
        for &d in devices {
            let ctx = cuda(format!("context on GPU {d}"), CudaContext::new(d))?;
            let name = cuda("cuDeviceGetName", ctx.name())?;
            let pci_bus_id = ctx
                .attribute(cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)
                .ok();
            let stream = cuda("stream", ctx.new_stream())?;
            let src = DevBuf::new(&ctx, size)?;
            let dst = DevBuf::new(&ctx, size)?;
            // SAFETY: filled below before anything reads it. Not write-combined: the
            // device-to-host check reads it back on the CPU.
            let mut host = cuda(format!("pinning {size} B for GPU {d}"), unsafe {
                ctx.alloc_pinned_with_flags::<u8>(size, 0)
            })?;
            cuda("pinned buffer", host.as_mut_slice())?.fill(HOST_PATTERN);
            // SAFETY: both buffers are `size` bytes on this context.
            cuda("memset", unsafe {
                cu::memset_d8_async(src.ptr, pattern(d), size, stream.cu_stream())
            })?;
            cuda("memset", unsafe {
                cu::memset_d8_async(dst.ptr, 0, size, stream.cu_stream())
            })?;
            cuda("sync", stream.synchronize())?;
            gpus.push(Gpu {
                index: d,
                name,
                pci_bus_id,
                ctx,
                stream,
                src,
                dst,
                host,
            });
        }
        let n = gpus.len();
        let mut access = vec![vec![false; n]; n];
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    access[i][j] = enable_peer(&gpus[i], &gpus[j])?;
                }
            }
        }
        Ok(Bench {
            gpus,
            access,
            size,
            warmup,
            iters,
        })
    }

    /// Times `iters` rounds of `enqueue` after `warmup` rounds: host clock around the
    /// launches and a sync of every stream involved, as nccl-tests times collectives.
    fn time(
        &self,
        involved: &[usize],
        mut enqueue: impl FnMut(&Bench) -> Result<(), GpuError>,
    ) -> Result<f64, GpuError> {
        for _ in 0..self.warmup {
            enqueue(self)?;
        }
        self.sync(involved)?;
        let start = Instant::now();
        for _ in 0..self.iters {
            enqueue(self)?;
        }
        self.sync(involved)?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / self.iters as f64)
    }

    fn sync(&self, involved: &[usize]) -> Result<(), GpuError> {
        for &i in involved {
            cuda(
                format!("sync GPU {}", self.gpus[i].index),
                self.gpus[i].stream.synchronize(),
            )?;
        }
        Ok(())
    }

    /// Copy `gpus[s].src` into `gpus[d].dst` on `gpus[s]`'s stream (a local copy when equal).
    fn enqueue_copy(&self, s: usize, d: usize) -> Result<(), GpuError> {
        let (a, b) = (&self.gpus[s], &self.gpus[d]);
        cuda("bind context", a.ctx.bind_to_thread())?;
        // SAFETY: both buffers hold `size` bytes and outlive the stream's work (synced in time()).
        let r = unsafe {
            if s == d {
                cu::memcpy_dtod_async(b.dst.ptr, a.src.ptr, self.size, a.stream.cu_stream())
            } else {
                cu::memcpy_peer_async(
                    b.ctx.cu_ctx(),
                    b.dst.ptr,
                    a.ctx.cu_ctx(),
                    a.src.ptr,
                    self.size,
                    a.stream.cu_stream(),
                )
            }
        };
        cuda(format!("copy GPU {} -> GPU {}", a.index, b.index), r)
    }

    fn clear_dst(&self, d: usize) -> Result<(), GpuError> {
        let g = &self.gpus[d];
        cuda("bind context", g.ctx.bind_to_thread())?;
        // SAFETY: `size` bytes on this context.
        cuda("memset", unsafe {
            cu::memset_d8_async(g.dst.ptr, 0, self.size, g.stream.cu_stream())
        })?;
        cuda("sync", g.stream.synchronize())
    }

    /// Bytes of `gpus[d].dst` (head and tail) that are not `want`.
    fn wrong_in_dst(&self, d: usize, want: u8) -> Result<u64, GpuError> {
        let g = &self.gpus[d];
        cuda("bind context", g.ctx.bind_to_thread())?;
        let n = CHECK_BYTES.min(self.size);
        let mut wrong = 0;
        for off in [0, self.size - n] {
            let mut buf = vec![0u8; n];
            // SAFETY: off + n <= size.
            cuda("read back", unsafe {
                cu::memcpy_dtoh_sync(&mut buf, g.dst.ptr + off as u64)
            })?;
            wrong += buf.iter().filter(|&&b| b != want).count() as u64;
        }
        Ok(wrong)
    }

    /// One-way copy from `s` to `d`: (time per copy in µs, wrong bytes).
    pub fn copy(&self, s: usize, d: usize) -> Result<(f64, u64), GpuError> {
        self.clear_dst(d)?;
        let us = self.time(&[s], |b| b.enqueue_copy(s, d))?;
        Ok((us, self.wrong_in_dst(d, pattern(self.gpus[s].index))?))
    }

    /// `s -> d` and `d -> s` at the same time, each on its source's stream.
    /// Returns the time per pair of copies and the wrong bytes of each direction.
    pub fn copy_bidir(&self, s: usize, d: usize) -> Result<(f64, u64, u64), GpuError> {
        self.clear_dst(d)?;
        self.clear_dst(s)?;
        let us = self.time(&[s, d], |b| {
            b.enqueue_copy(s, d)?;
            b.enqueue_copy(d, s)
        })?;
        let sd = self.wrong_in_dst(d, pattern(self.gpus[s].index))?;
        Ok((us, sd, self.wrong_in_dst(s, pattern(self.gpus[d].index))?))
    }

    /// Pinned host buffer to `gpus[i].dst`.
    pub fn h2d(&self, i: usize) -> Result<(f64, u64), GpuError> {
        self.clear_dst(i)?;
        let g = &self.gpus[i];
        let host = cuda("pinned buffer", g.host.as_slice())?;
        let us = self.time(&[i], |_| {
            cuda("bind context", g.ctx.bind_to_thread())?;
            // SAFETY: the pinned buffer outlives the copies (synced in time()).
            cuda("copy host -> device", unsafe {
                cu::memcpy_htod_async(g.dst.ptr, host, g.stream.cu_stream())
            })
        })?;
        Ok((us, self.wrong_in_dst(i, HOST_PATTERN)?))
    }

    /// `gpus[i].src` to the pinned host buffer; every byte is checked afterwards.
    pub fn d2h(&mut self, i: usize) -> Result<(f64, u64), GpuError> {
        let (size, warmup, iters) = (self.size, self.warmup, self.iters);
        let g = &mut self.gpus[i];
        cuda("pinned buffer", g.host.as_mut_slice())?.fill(0);
        cuda("bind context", g.ctx.bind_to_thread())?;
        let (src, stream) = (g.src.ptr, g.stream.clone());
        let host = cuda("pinned buffer", g.host.as_mut_slice())?;
        let once = |host: &mut [u8]| {
            // SAFETY: `size` bytes each way; synced before the buffer is read.
            cuda("copy device -> host", unsafe {
                cu::memcpy_dtoh_async(&mut host[..size], src, stream.cu_stream())
            })
        };
        for _ in 0..warmup {
            once(host)?;
        }
        cuda("sync", stream.synchronize())?;
        let start = Instant::now();
        for _ in 0..iters {
            once(host)?;
        }
        cuda("sync", stream.synchronize())?;
        let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let want = pattern(g.index);
        Ok((us, host.iter().filter(|&&b| b != want).count() as u64))
    }

    pub fn path(&self, s: usize, d: usize) -> Path {
        if s == d {
            Path::Local
        } else if self.access[s][d] {
            Path::P2p
        } else {
            Path::Staged
        }
    }
}

/// Turns on `a`'s access to `b`'s memory where the hardware allows it.
fn enable_peer(a: &Gpu, b: &Gpu) -> Result<bool, GpuError> {
    let mut can = 0i32;
    // SAFETY: writes one int; both are valid device handles.
    let r = unsafe { cusys::cuDeviceCanAccessPeer(&mut can, a.ctx.cu_device(), b.ctx.cu_device()) }
        .result();
    cuda(
        format!("cuDeviceCanAccessPeer({}, {})", a.index, b.index),
        r,
    )?;
    if can == 0 {
        return Ok(false);
    }
    cuda("bind context", a.ctx.bind_to_thread())?;
    // SAFETY: enables the current context's access to a live peer context.
    match unsafe { cusys::cuCtxEnablePeerAccess(b.ctx.cu_ctx(), 0) } {
        cusys::CUresult::CUDA_SUCCESS | cusys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(true)
        }
        other => {
            tracing::warn!(from = a.index, to = b.index, error = ?other, "peer access reported but cannot be enabled; copies are staged");
            Ok(false)
        }
    }
}
