//! Test data made and checked on the GPU, so that validating an 8 GiB buffer costs a few
//! passes over device memory instead of a fill, two copies and a compare on the host.
//!
//! The kernels (`kernels.cu`, embedded as PTX and compiled by the driver when a context
//! loads them) see every segment of [`check`] as bytes: a period of the pattern, the
//! phase at which the segment starts, and for the average of floating types the decoded
//! expected values and the tolerance. What a segment holds is decided in `check.rs` only;
//! the host functions there (`fill`, `count_wrong`) stay as the reference these kernels
//! are tested against.

use std::ffi::{CString, c_void};

use cudarc::driver::{result as cu, sys as cusys};

use super::check::{self, PERIOD, Segment};
use super::spec::Dtype;

/// The kernels, built from `kernels.cu` (the command is at its top).
const PTX: &str = include_str!("kernels.ptx");
const THREADS: u32 = 256;
/// Resident blocks per multiprocessor that the grid-stride loops are sized for.
const BLOCKS_PER_SM: u32 = 8;

/// A period of a pattern, as the kernels take it (`struct Pattern` in kernels.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pattern {
    pub bytes: [u8; 128],
    pub len: u32,
    pub elem: u32,
}

/// Expected values and tolerance (`struct Expect` in kernels.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Expect {
    value: [f64; 16],
    tol: f64,
}

impl Pattern {
    /// The bytes of a segment's pattern and the byte phase of its first element:
    /// byte `j` of the segment must be `bytes[(phase + j) % len]`.
    pub fn of(seg: &Segment) -> (Pattern, u32) {
        let elem = seg.table[0].len();
        let mut bytes = [0u8; 128];
        for (k, v) in seg.table.iter().enumerate() {
            bytes[k * elem..(k + 1) * elem].copy_from_slice(v);
        }
        let len = (PERIOD * elem) as u32;
        let phase = ((seg.offset % PERIOD) * elem) as u32;
        (
            Pattern {
                bytes,
                len,
                elem: elem as u32,
            },
            phase,
        )
    }
}

/// The loaded module of one context.
pub struct Kernels {
    module: cusys::CUmodule,
    fill: cusys::CUfunction,
    exact: cusys::CUfunction,
    /// half, bfloat16, float, double.
    close: [cusys::CUfunction; 4],
    max_blocks: u32,
}

impl Kernels {
    /// Loads the kernels into the context bound to this thread (the context of `device`).
    pub fn load(device: usize) -> Result<Kernels, cu::DriverError> {
        let dev = cu::device::get(device as i32)?;
        // SAFETY: a valid device handle and attribute.
        let sms = unsafe {
            cu::device::get_attribute(
                dev,
                cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?
        };
        let image = CString::new(PTX).expect("the PTX has no NUL byte");
        // SAFETY: a NUL-terminated PTX image; the driver copies what it needs.
        let module = unsafe { cu::module::load_data(image.as_ptr() as *const c_void)? };
        let get = |name: &str| {
            let name = CString::new(name).expect("kernel names have no NUL byte");
            // SAFETY: the module was just loaded and is not unloaded before Drop.
            unsafe { cu::module::get_function(module, name) }
        };
        Ok(Kernels {
            module,
            fill: get("heddle_fill")?,
            exact: get("heddle_count_exact")?,
            close: [
                get("heddle_count_close_f16")?,
                get("heddle_count_close_bf16")?,
                get("heddle_count_close_f32")?,
                get("heddle_count_close_f64")?,
            ],
            max_blocks: (sms.max(1) as u32) * BLOCKS_PER_SM,
        })
    }

    fn grid(&self, work: u64) -> u32 {
        work.div_ceil(THREADS as u64)
            .clamp(1, self.max_blocks as u64) as u32
    }

    /// Writes `seg` into the buffer at `base` (its element 0), on `stream`.
    ///
    /// # Safety
    /// `base` must hold the whole segment, and `stream` belong to the bound context.
    pub unsafe fn fill(
        &self,
        stream: cusys::CUstream,
        base: cusys::CUdeviceptr,
        seg: &Segment,
    ) -> Result<(), cu::DriverError> {
        let elem = seg.table[0].len() as u64;
        let mut ptr = base + seg.start as u64 * elem;
        let mut n = seg.len as u64 * elem;
        if n == 0 {
            return Ok(());
        }
        let (mut pattern, mut phase) = Pattern::of(seg);
        let mut params: [*mut c_void; 4] = [
            &mut ptr as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
            &mut phase as *mut _ as *mut c_void,
            &mut pattern as *mut _ as *mut c_void,
        ];
        let grid = self.grid(n / 16);
        // SAFETY: the parameters match heddle_fill's; the caller vouches for the buffer.
        unsafe {
            cu::launch_kernel(
                self.fill,
                (grid, 1, 1),
                (THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
    }

    /// Adds to the `u64` at `counter` the elements of the buffer at `base` that break
    /// `seg`: bit for bit, or beyond the relative tolerance `tol` (float types only).
    ///
    /// # Safety
    /// As [`Kernels::fill`]; `counter` must be 8 bytes of device memory.
    pub unsafe fn count(
        &self,
        stream: cusys::CUstream,
        base: cusys::CUdeviceptr,
        seg: &Segment,
        dtype: Dtype,
        tol: Option<f64>,
        counter: cusys::CUdeviceptr,
    ) -> Result<(), cu::DriverError> {
        let elem = dtype.size() as u64;
        let mut ptr = base + seg.start as u64 * elem;
        let mut counter = counter;
        let grid = self.grid(seg.len as u64);
        if seg.len == 0 {
            return Ok(());
        }
        let (f, mut params_owned) = match tol.filter(|_| dtype.is_float()) {
            Some(tol) => {
                let mut value = [0.0; 16];
                for (k, v) in seg.table.iter().enumerate() {
                    value[k] = check::decode(dtype, v);
                }
                let f = match dtype {
                    Dtype::Half => self.close[0],
                    Dtype::Bfloat16 => self.close[1],
                    Dtype::Float => self.close[2],
                    _ => self.close[3],
                };
                let n = seg.len as u64;
                let offset = (seg.offset % PERIOD) as u32;
                (f, Params::Close(n, offset, Expect { value, tol }))
            }
            None => {
                let (pattern, phase) = Pattern::of(seg);
                (
                    self.exact,
                    Params::Exact(seg.len as u64 * elem, phase, pattern),
                )
            }
        };
        let mut params: [*mut c_void; 5] = match &mut params_owned {
            Params::Close(n, offset, expect) => [
                &mut ptr as *mut _ as *mut c_void,
                n as *mut _ as *mut c_void,
                offset as *mut _ as *mut c_void,
                expect as *mut _ as *mut c_void,
                &mut counter as *mut _ as *mut c_void,
            ],
            Params::Exact(n, phase, pattern) => [
                &mut ptr as *mut _ as *mut c_void,
                n as *mut _ as *mut c_void,
                phase as *mut _ as *mut c_void,
                pattern as *mut _ as *mut c_void,
                &mut counter as *mut _ as *mut c_void,
            ],
        };
        // SAFETY: the parameters match the kernel's; the caller vouches for the buffers.
        unsafe { cu::launch_kernel(f, (grid, 1, 1), (THREADS, 1, 1), 0, stream, &mut params) }
    }
}

/// Kernel arguments that must outlive the launch call.
enum Params {
    Close(u64, u32, Expect),
    Exact(u64, u32, Pattern),
}

impl Drop for Kernels {
    fn drop(&mut self) {
        // SAFETY: loaded once in `load`, unloaded once here, with its context bound by the
        // owner (the engine binds each rank's context before dropping its resources).
        let _ = unsafe { cu::module::unload(self.module) };
    }
}

/// A local GPU as nccl-tests' "Using devices" lines show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceInfo {
    pub device: usize,
    pub name: String,
    /// `domain:bus:device`, as nccl-tests prints it (e.g. `0000:19:00`).
    pub bus_id: String,
}

/// Names and PCI addresses of `devices` (after `cuInit`).
pub fn describe_devices(devices: &[usize]) -> Result<Vec<DeviceInfo>, String> {
    use cusys::CUdevice_attribute as A;
    devices
        .iter()
        .map(|&d| {
            let dev = cu::device::get(d as i32).map_err(|e| format!("GPU {d}: {e:?}"))?;
            let attr = |a: A| {
                // SAFETY: a valid device handle and attribute.
                unsafe { cu::device::get_attribute(dev, a) }
                    .map_err(|e| format!("GPU {d}: cuDeviceGetAttribute: {e:?}"))
            };
            Ok(DeviceInfo {
                device: d,
                name: cu::device::get_name(dev)
                    .map_err(|e| format!("GPU {d}: cuDeviceGetName: {e:?}"))?,
                bus_id: format!(
                    "{:04x}:{:02x}:{:02x}",
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
                ),
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
