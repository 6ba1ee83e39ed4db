//! The kernels against the host reference of `check.rs`. Without a CUDA device the tests
//! that need one say so and pass; the pattern arithmetic is tested everywhere.

use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::*;
use crate::runner::nccl::check::{count_wrong, expected_segments, fill, input_table, tolerance};
use crate::runner::nccl::spec::{Collective, RedOp};

struct Gpu {
    _ctx: Arc<CudaContext>,
    stream: cusys::CUstream,
    kernels: Kernels,
}

impl Gpu {
    /// GPU 0 with the kernels loaded, or `None` (and why) on a machine without one.
    fn open(test: &str) -> Option<Gpu> {
        // SAFETY: only dlopen attempts.
        if !unsafe { cusys::is_culib_present() } {
            eprintln!("SKIPPED {test}: no CUDA driver (libcuda.so.1) on this machine");
            return None;
        }
        if cu::init().is_err() || cu::device::get_count().unwrap_or(0) == 0 {
            eprintln!("SKIPPED {test}: the CUDA driver reports no device");
            return None;
        }
        let ctx = CudaContext::new(0).expect("context on GPU 0");
        ctx.bind_to_thread().unwrap();
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).unwrap();
        let kernels = Kernels::load(0).expect("the PTX loads");
        Some(Gpu {
            _ctx: ctx,
            stream,
            kernels,
        })
    }

    fn alloc(&self, bytes: usize) -> cusys::CUdeviceptr {
        // SAFETY: a plain allocation on the bound context; tests free it.
        unsafe { cu::malloc_sync(bytes) }.unwrap()
    }

    fn upload(&self, dst: cusys::CUdeviceptr, src: &[u8]) {
        // SAFETY: dst holds src.len() bytes.
        unsafe { cu::memcpy_htod_sync(dst, src) }.unwrap();
        // The copy may still be in flight, and our stream does not wait for the legacy one.
        cu::ctx::synchronize().unwrap();
    }

    fn set(&self, dst: cusys::CUdeviceptr, byte: u8, len: usize) {
        // SAFETY: dst holds len bytes.
        unsafe { cu::memset_d8_sync(dst, byte, len) }.unwrap();
        cu::ctx::synchronize().unwrap();
    }

    fn download(&self, src: cusys::CUdeviceptr, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: our stream is synchronized first; src holds len bytes.
        unsafe {
            cu::stream::synchronize(self.stream).unwrap();
            cu::memcpy_dtoh_sync(&mut out, src).unwrap();
        }
        out
    }

    /// The GPU's count of elements that break `segs` in the buffer at `base`.
    fn count(
        &self,
        base: cusys::CUdeviceptr,
        counter: cusys::CUdeviceptr,
        segs: &[Segment],
        dtype: Dtype,
        tol: Option<f64>,
    ) -> u64 {
        self.upload(counter, &[0u8; 8]);
        for s in segs {
            // SAFETY: base holds every segment; counter is 8 bytes.
            unsafe {
                self.kernels
                    .count(self.stream, base, s, dtype, tol, counter)
            }
            .unwrap();
        }
        u64::from_le_bytes(self.download(counter, 8).try_into().unwrap())
    }
}

#[test]
fn pattern_and_phase_reproduce_the_host_fill() {
    for dtype in Dtype::ALL {
        for op in RedOp::ALL {
            for (rank, offset) in [(0, 0), (1, 5), (3, 13), (7, 20)] {
                let seg = Segment {
                    start: 0,
                    len: 57,
                    offset,
                    table: input_table(dtype, op, rank),
                };
                let mut host = vec![0u8; seg.len * dtype.size()];
                fill(&mut host, &seg);
                let (p, phase) = Pattern::of(&seg);
                assert_eq!(p.elem as usize, dtype.size());
                for (j, b) in host.iter().enumerate() {
                    assert_eq!(
                        *b,
                        p.bytes[(phase as usize + j) % p.len as usize],
                        "{dtype:?} {op:?} byte {j}"
                    );
                }
            }
        }
    }
}

#[test]
fn gpu_fill_matches_the_host_fill() {
    let Some(g) = Gpu::open("gpu_fill_matches_the_host_fill") else {
        return;
    };
    // (start, len, offset) in elements: empty, shorter than 16 bytes, unaligned starts,
    // several periods, and more than one grid-stride round.
    let cases = [
        (0, 0, 0),
        (0, 1, 0),
        (1, 13, 5),
        (3, 100, 13),
        (17, 10_007, 6),
        (5, (3 << 20) + 7, 3),
    ];
    let cap = (5 + (3 << 20) + 7) * 8 + 64;
    let buf = g.alloc(cap);
    for (i, dtype) in Dtype::ALL.into_iter().enumerate() {
        let op = RedOp::ALL[i % RedOp::ALL.len()];
        for &(start, len, offset) in &cases {
            let es = dtype.size();
            let bytes = (start + len) * es + 16;
            let seg = Segment {
                start,
                len,
                offset,
                table: input_table(dtype, op, 2),
            };
            let poison = vec![0xabu8; bytes];
            g.upload(buf, &poison);
            // SAFETY: buf holds the segment.
            unsafe { g.kernels.fill(g.stream, buf, &seg) }.unwrap();
            let got = g.download(buf, bytes);
            let mut want = poison.clone();
            fill(&mut want, &seg);
            assert!(
                got == want,
                "{dtype:?} start {start} len {len} offset {offset}"
            );
        }
    }
    unsafe { cu::free_sync(buf) }.unwrap();
}

/// A deterministic position from a counter (no two tests need the same randomness).
fn spot(i: usize, len: usize) -> usize {
    (i * 7919 + 13) % len
}

#[test]
fn gpu_counts_match_the_host_count_for_every_collective_type_and_op() {
    let Some(g) = Gpu::open("gpu_counts_match_the_host_count") else {
        return;
    };
    let buf = g.alloc(1 << 20);
    let counter = g.alloc(8);
    let mut corrupted_cases = 0;
    for coll in Collective::ALL {
        for dtype in Dtype::ALL {
            let es = dtype.size();
            for op in RedOp::ALL {
                let tol = tolerance(dtype, op);
                for n in [1, 2, 3, 8] {
                    let c = coll.counts(1000 * es as u64, es, n);
                    for r in 0..n {
                        let segs = expected_segments(coll, dtype, op, r, n, n - 1, &c);
                        if segs.is_empty() {
                            continue;
                        }
                        let len = segs.iter().map(|s| s.start + s.len).max().unwrap();
                        let mut out = vec![0u8; len * es];
                        for s in &segs {
                            fill(&mut out, s);
                        }
                        g.upload(buf, &out);
                        assert_eq!(g.count(buf, counter, &segs, dtype, tol), 0);
                        // Corrupt r + 1 elements: flip the top bit of their last byte, and
                        // move one more by one unit in its lowest byte (a rounding error
                        // for `avg` of floats, a corruption everywhere else).
                        for i in 0..=r {
                            out[spot(i, len) * es + es - 1] ^= 0x80;
                        }
                        out[spot(r + 1, len) * es] ^= 0x01;
                        g.upload(buf, &out);
                        let want = count_wrong(&out, dtype, &segs, tol);
                        assert!(want >= 1, "{coll} {dtype:?} {op:?} n={n} r={r}");
                        corrupted_cases += 1;
                        assert_eq!(
                            g.count(buf, counter, &segs, dtype, tol),
                            want,
                            "{coll} {dtype:?} {op:?} n={n} r={r}"
                        );
                    }
                }
            }
        }
    }
    assert!(corrupted_cases > 3000, "{corrupted_cases}");
    unsafe {
        cu::free_sync(buf).unwrap();
        cu::free_sync(counter).unwrap();
    }
}

#[test]
fn gpu_counts_every_wrong_element_of_a_large_unaligned_buffer() {
    let Some(g) = Gpu::open("gpu_counts_every_wrong_element_of_a_large_buffer") else {
        return;
    };
    let counter = g.alloc(8);
    for (dtype, op) in [
        (Dtype::Float, RedOp::Sum),
        (Dtype::Int8, RedOp::Max),
        (Dtype::Bfloat16, RedOp::Avg),
        (Dtype::Uint64, RedOp::Prod),
    ] {
        let es = dtype.size();
        let len = (64 << 20) / es + 5;
        let seg = Segment {
            start: 3,
            len,
            offset: 11,
            table: check::reduced_table(dtype, op, 4),
        };
        let buf = g.alloc((3 + len) * es);
        // SAFETY: buf holds the segment.
        unsafe { g.kernels.fill(g.stream, buf, &seg) }.unwrap();
        let tol = tolerance(dtype, op);
        let segs = std::slice::from_ref(&seg);
        assert_eq!(g.count(buf, counter, segs, dtype, tol), 0, "{dtype:?}");
        // Three elements set to all-ones bytes (NaN for floats): first, middle, last.
        for t in [0, len / 2, len - 1] {
            g.set(buf + ((3 + t) * es) as u64, 0xff, es);
        }
        assert_eq!(g.count(buf, counter, segs, dtype, tol), 3, "{dtype:?}");
        // An output nobody wrote (zeros) is wrong everywhere: no pattern value is 0.
        g.set(buf, 0, (3 + len) * es);
        assert_eq!(
            g.count(buf, counter, segs, dtype, tol),
            len as u64,
            "{dtype:?}"
        );
        unsafe { cu::free_sync(buf) }.unwrap();
    }
    unsafe { cu::free_sync(counter) }.unwrap();
    unsafe { cu::stream::destroy(g.stream) }.unwrap();
}

#[test]
fn nccl_results_validate_for_every_collective_type_and_op_on_one_rank() {
    use crate::runner::nccl::engine::{Case, Engine, Topology};
    use crate::runner::nccl::{loader, timing};
    let test = "nccl_results_validate_for_every_collective_type_and_op_on_one_rank";
    match loader::probe() {
        loader::Probe::Ready => {}
        other => {
            eprintln!("SKIPPED {test}: NCCL cannot be loaded as this process stands: {other:?}");
            return;
        }
    }
    let topo = Topology {
        devices: vec![0],
        first_rank: 0,
        nranks: 1,
    };
    let engine = Engine::new(&topo, None, (1 << 20) + 64).expect("one-rank communicator");
    let settings = timing::Settings {
        warmup: 1,
        iters: 2,
        graph: Some(0),
        check: true,
    };
    let mut checked = 0;
    for coll in Collective::ALL {
        for dtype in Dtype::ALL {
            for op in RedOp::ALL {
                if !coll.reduces() && op != RedOp::Sum {
                    continue;
                }
                let k = Case {
                    coll,
                    dtype,
                    op,
                    root: 0,
                };
                // One element, an odd count past a 16-byte boundary, and 1 MiB.
                for bytes in [8, 4096 + 3 * 8, 1 << 20] {
                    let c = coll.counts(bytes, dtype.size(), 1);
                    if c.bytes == 0 {
                        continue;
                    }
                    for in_place in [false, true] {
                        let t = timing::measure(&engine, &k, &c, in_place, &settings, None)
                            .unwrap_or_else(|e| panic!("{coll} {dtype:?} {op:?} {bytes}: {e}"));
                        assert_eq!(
                            t.wrong,
                            Some(0),
                            "{coll} {dtype:?} {op:?} {bytes} B in_place={in_place}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 6 * 40, "{checked}");
}
