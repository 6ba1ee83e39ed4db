//! Result validation, as nccl-tests does it: every rank fills its input with values that
//! depend only on (rank, element index), the expected output is computed on the host, and
//! the elements that differ are counted (`#wrong`).
//!
//! Inputs are small integers, so sums, products, minima and maxima are exact in every
//! data type whatever order NCCL adds them in, and a mismatch is a real corruption, not
//! rounding. Only `avg` of floating types is compared with a tolerance, because NCCL
//! scales before or after summing depending on the algorithm.
//!
//! Values repeat with a short period, so a buffer is filled by copying one period and the
//! expected output is a table lookup per element: checking an 8 GiB buffer costs a
//! memory pass, not a reduction over the ranks per element.

use half::{bf16, f16};

use super::spec::{Collective, Counts, Dtype, RedOp};

/// Period of the input pattern (a multiple of both patterns' periods below).
pub const PERIOD: usize = 14;

/// The value rank `rank` puts at element `k` of its input.
pub fn input_value(op: RedOp, rank: usize, k: usize) -> i64 {
    match op {
        // 1s and 2s: a product over n ranks stays a power of two (exact in every float).
        RedOp::Prod => 1 + ((k + rank) % 2) as i64,
        _ => 1 + ((k + 2 * rank) % 7) as i64,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(i128),
    Float(f64),
}

/// Encodes a value the way the device stores it; integers wrap like the device's
/// two's-complement arithmetic does.
pub fn encode(dtype: Dtype, v: Value) -> Vec<u8> {
    let (i, f) = match v {
        Value::Int(i) => (i, i as f64),
        Value::Float(f) => (f as i128, f),
    };
    match dtype {
        Dtype::Int8 => (i as i8).to_le_bytes().to_vec(),
        Dtype::Uint8 => (i as u8).to_le_bytes().to_vec(),
        Dtype::Int32 => (i as i32).to_le_bytes().to_vec(),
        Dtype::Uint32 => (i as u32).to_le_bytes().to_vec(),
        Dtype::Int64 => (i as i64).to_le_bytes().to_vec(),
        Dtype::Uint64 => (i as u64).to_le_bytes().to_vec(),
        Dtype::Half => f16::from_f64(f).to_le_bytes().to_vec(),
        Dtype::Bfloat16 => bf16::from_f64(f).to_le_bytes().to_vec(),
        Dtype::Float => (f as f32).to_le_bytes().to_vec(),
        Dtype::Double => f.to_le_bytes().to_vec(),
    }
}

pub fn decode(dtype: Dtype, b: &[u8]) -> f64 {
    match dtype {
        Dtype::Int8 => i8::from_le_bytes([b[0]]) as f64,
        Dtype::Uint8 => b[0] as f64,
        Dtype::Int32 => i32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        Dtype::Uint32 => u32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        Dtype::Int64 => i64::from_le_bytes(b[..8].try_into().unwrap()) as f64,
        Dtype::Uint64 => u64::from_le_bytes(b[..8].try_into().unwrap()) as f64,
        Dtype::Half => f16::from_le_bytes([b[0], b[1]]).to_f64(),
        Dtype::Bfloat16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        Dtype::Float => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        Dtype::Double => f64::from_le_bytes(b[..8].try_into().unwrap()),
    }
}

/// The reduction of the ranks' values, computed as the device would (wrapping for
/// integers, truncating division for an integer average).
pub fn reduce(op: RedOp, dtype: Dtype, values: &[i64]) -> Value {
    let n = values.len().max(1);
    if dtype.is_float() {
        let it = values.iter().map(|&v| v as f64);
        return Value::Float(match op {
            RedOp::Sum => it.sum(),
            RedOp::Prod => it.product(),
            RedOp::Max => it.fold(f64::MIN, f64::max),
            RedOp::Min => it.fold(f64::MAX, f64::min),
            RedOp::Avg => it.sum::<f64>() / n as f64,
        });
    }
    let it = values.iter().map(|&v| v as i128);
    Value::Int(match op {
        RedOp::Sum => it.sum(),
        // Wrap at every step, as the device does, so no intermediate overflows i128.
        RedOp::Prod => it.fold(1i128, |acc, v| {
            let bits = dtype.size() as u32 * 8;
            (acc * v) & ((1i128 << bits) - 1)
        }),
        RedOp::Max => it.max().unwrap_or(0),
        RedOp::Min => it.min().unwrap_or(0),
        RedOp::Avg => {
            let bits = dtype.size() as u32 * 8;
            let sum: i128 = it.sum::<i128>() & ((1i128 << bits) - 1);
            sum / n as i128
        }
    })
}

/// Encoded values for each residue of the element index modulo [`PERIOD`].
pub type Table = Vec<Vec<u8>>;

pub fn input_table(dtype: Dtype, op: RedOp, rank: usize) -> Table {
    (0..PERIOD)
        .map(|k| encode(dtype, Value::Int(input_value(op, rank, k) as i128)))
        .collect()
}

pub fn reduced_table(dtype: Dtype, op: RedOp, nranks: usize) -> Table {
    (0..PERIOD)
        .map(|k| {
            let vals: Vec<i64> = (0..nranks).map(|q| input_value(op, q, k)).collect();
            encode(dtype, reduce(op, dtype, &vals))
        })
        .collect()
}

/// A run of elements whose element `t` must equal `table[(t + offset) % PERIOD]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub start: usize,
    pub len: usize,
    pub offset: usize,
    pub table: Table,
}

/// Where this rank's input goes, relative to the buffer the collective reads (the send
/// buffer, or for in-place runs the shared buffer).
pub fn input_segments(
    coll: Collective,
    dtype: Dtype,
    op: RedOp,
    rank: usize,
    counts: &Counts,
    in_place: bool,
) -> Vec<Segment> {
    let table = input_table(dtype, op, rank);
    let start = if in_place && coll == Collective::AllGather {
        rank * counts.param
    } else {
        0
    };
    vec![Segment {
        start,
        len: counts.send,
        offset: 0,
        table,
    }]
}

/// What this rank's output must hold, relative to the start of its output (for an
/// in-place reduce_scatter, the rank's slice of the shared buffer). Empty when nothing on
/// this rank is defined (a reduce on a rank that is not the root).
pub fn expected_segments(
    coll: Collective,
    dtype: Dtype,
    op: RedOp,
    rank: usize,
    nranks: usize,
    root: usize,
    counts: &Counts,
) -> Vec<Segment> {
    let chunk = counts.param;
    match coll {
        Collective::AllReduce => vec![Segment {
            start: 0,
            len: counts.recv,
            offset: 0,
            table: reduced_table(dtype, op, nranks),
        }],
        Collective::Reduce if rank == root => vec![Segment {
            start: 0,
            len: counts.recv,
            offset: 0,
            table: reduced_table(dtype, op, nranks),
        }],
        Collective::Reduce => vec![],
        Collective::Broadcast => vec![Segment {
            start: 0,
            len: counts.recv,
            offset: 0,
            table: input_table(dtype, op, root),
        }],
        Collective::AllGather => (0..nranks)
            .map(|q| Segment {
                start: q * chunk,
                len: chunk,
                offset: 0,
                table: input_table(dtype, op, q),
            })
            .collect(),
        Collective::ReduceScatter => vec![Segment {
            start: 0,
            len: chunk,
            offset: (rank * chunk) % PERIOD,
            table: reduced_table(dtype, op, nranks),
        }],
        Collective::AllToAll => (0..nranks)
            .map(|q| Segment {
                start: q * chunk,
                len: chunk,
                offset: (rank * chunk) % PERIOD,
                table: input_table(dtype, op, q),
            })
            .collect(),
        Collective::SendRecv => vec![Segment {
            start: 0,
            len: counts.recv,
            offset: 0,
            table: input_table(dtype, op, (rank + nranks - 1) % nranks),
        }],
    }
}

/// Writes a segment's pattern into `buf` (element size taken from the table).
pub fn fill(buf: &mut [u8], seg: &Segment) {
    let es = seg.table[0].len();
    let dst = &mut buf[seg.start * es..(seg.start + seg.len) * es];
    // One full period in pattern order, then doubling copies: memcpy speed.
    let first = dst.len().min(PERIOD * es);
    for t in 0..first / es {
        dst[t * es..(t + 1) * es].copy_from_slice(&seg.table[(t + seg.offset) % PERIOD]);
    }
    let mut done = first;
    while done < dst.len() {
        // Copy a whole number of periods so the phase is kept.
        let n = done.min(dst.len() - done);
        let n = if n >= PERIOD * es {
            n / (PERIOD * es) * (PERIOD * es)
        } else {
            n
        };
        dst.copy_within(0..n, done);
        done += n;
    }
}

/// Relative tolerance for `avg` of a floating type; `None` where results must be exact.
pub fn tolerance(dtype: Dtype, op: RedOp) -> Option<f64> {
    if op != RedOp::Avg || !dtype.is_float() {
        return None;
    }
    Some(match dtype {
        Dtype::Half => 1e-2,
        Dtype::Bfloat16 => 2e-2,
        Dtype::Float => 1e-5,
        _ => 1e-12,
    })
}

/// Elements of `out` that differ from the segments, split over threads for big buffers.
pub fn count_wrong(out: &[u8], dtype: Dtype, segs: &[Segment], tol: Option<f64>) -> u64 {
    let es = dtype.size();
    let mut wrong = 0;
    for seg in segs {
        let bytes = &out[seg.start * es..(seg.start + seg.len) * es];
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(16);
        // Chunks are whole periods so each thread knows its phase.
        let per = (seg.len / threads / PERIOD + 1) * PERIOD;
        wrong += std::thread::scope(|s| {
            let handles: Vec<_> = bytes
                .chunks(per * es)
                .enumerate()
                .map(|(c, chunk)| {
                    let phase = (seg.offset + c * per) % PERIOD;
                    let table = &seg.table;
                    s.spawn(move || {
                        let mut w = 0u64;
                        for (t, got) in chunk.chunks_exact(es).enumerate() {
                            let want = &table[(t + phase) % PERIOD];
                            if got != want.as_slice() {
                                let bad = match tol {
                                    Some(tol) => {
                                        let (g, e) = (decode(dtype, got), decode(dtype, want));
                                        // Written so that NaN counts as wrong.
                                        let close = (g - e).abs() <= tol * e.abs().max(1.0);
                                        !close
                                    }
                                    None => true,
                                };
                                w += u64::from(bad);
                            }
                        }
                        w
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(u64::MAX))
                .sum::<u64>()
        });
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected output computed the slow way: simulate the collective on host
    /// buffers built element by element from `input_value`.
    fn simulate(
        coll: Collective,
        dtype: Dtype,
        op: RedOp,
        n: usize,
        root: usize,
        c: &Counts,
    ) -> Vec<Vec<u8>> {
        let chunk = c.param;
        let inp = |q: usize, k: usize| input_value(op, q, k);
        (0..n)
            .map(|r| {
                let vals: Vec<Value> = match coll {
                    Collective::AllReduce | Collective::Reduce => (0..c.recv)
                        .map(|k| reduce(op, dtype, &(0..n).map(|q| inp(q, k)).collect::<Vec<_>>()))
                        .collect(),
                    Collective::Broadcast => (0..c.recv)
                        .map(|k| Value::Int(inp(root, k) as i128))
                        .collect(),
                    Collective::AllGather => (0..c.recv)
                        .map(|j| Value::Int(inp(j / chunk, j % chunk) as i128))
                        .collect(),
                    Collective::ReduceScatter => (0..chunk)
                        .map(|i| {
                            reduce(
                                op,
                                dtype,
                                &(0..n).map(|q| inp(q, r * chunk + i)).collect::<Vec<_>>(),
                            )
                        })
                        .collect(),
                    Collective::AllToAll => (0..c.recv)
                        .map(|j| Value::Int(inp(j / chunk, r * chunk + j % chunk) as i128))
                        .collect(),
                    Collective::SendRecv => (0..c.recv)
                        .map(|k| Value::Int(inp((r + n - 1) % n, k) as i128))
                        .collect(),
                };
                vals.into_iter().flat_map(|v| encode(dtype, v)).collect()
            })
            .collect()
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn segments_agree_with_a_simulation_of_every_collective() {
        for coll in Collective::ALL {
            for dtype in [
                Dtype::Float,
                Dtype::Int8,
                Dtype::Half,
                Dtype::Bfloat16,
                Dtype::Uint64,
            ] {
                for op in RedOp::ALL {
                    for n in [1, 2, 3, 8] {
                        let c = coll.counts(1000 * dtype.size() as u64, dtype.size(), n);
                        let root = n - 1;
                        let sim = simulate(coll, dtype, op, n, root, &c);
                        for r in 0..n {
                            let segs = expected_segments(coll, dtype, op, r, n, root, &c);
                            if coll == Collective::Reduce && r != root {
                                assert!(segs.is_empty());
                                continue;
                            }
                            assert_eq!(
                                count_wrong(&sim[r], dtype, &segs, tolerance(dtype, op)),
                                0,
                                "{coll} {dtype:?} {op:?} n={n} r={r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn corruption_is_counted_per_element() {
        let c = Collective::AllReduce.counts(4096, 4, 2);
        let segs = expected_segments(Collective::AllReduce, Dtype::Float, RedOp::Sum, 0, 2, 0, &c);
        let mut out = vec![0u8; c.recv * 4];
        for s in &segs {
            fill(&mut out, s);
        }
        assert_eq!(count_wrong(&out, Dtype::Float, &segs, None), 0);
        out[4 * 7] ^= 0x01; // one bit of element 7
        out[4 * 500 + 3] = 0x7f; // element 500
        assert_eq!(count_wrong(&out, Dtype::Float, &segs, None), 2);
        // An untouched (zeroed) output is entirely wrong: nothing is 0 in the pattern.
        let zero = vec![0u8; c.recv * 4];
        assert_eq!(count_wrong(&zero, Dtype::Float, &segs, None), c.recv as u64);
    }

    #[test]
    fn fill_keeps_the_phase_over_large_buffers() {
        let seg = Segment {
            start: 3,
            len: 10_007,
            offset: 5,
            table: input_table(Dtype::Int32, RedOp::Sum, 1),
        };
        let mut buf = vec![0u8; (3 + 10_007) * 4];
        fill(&mut buf, &seg);
        assert_eq!(&buf[..12], &[0u8; 12]);
        for t in 0..seg.len {
            let got = i32::from_le_bytes(buf[(3 + t) * 4..(4 + t) * 4].try_into().unwrap());
            assert_eq!(got as i64, input_value(RedOp::Sum, 1, t + 5), "t={t}");
        }
    }

    #[test]
    fn reductions_wrap_and_round_like_the_device() {
        assert_eq!(
            reduce(RedOp::Sum, Dtype::Int8, &[100, 100]),
            Value::Int(200)
        );
        assert_eq!(encode(Dtype::Int8, Value::Int(200)), vec![200u8]); // -56 as i8
        assert_eq!(
            encode(Dtype::Uint8, reduce(RedOp::Prod, Dtype::Uint8, &[2; 9])),
            vec![0]
        );
        assert_eq!(reduce(RedOp::Avg, Dtype::Int32, &[1, 2]), Value::Int(1));
        assert_eq!(reduce(RedOp::Avg, Dtype::Float, &[1, 2]), Value::Float(1.5));
        assert_eq!(
            reduce(RedOp::Max, Dtype::Half, &[3, 7, 1]),
            Value::Float(7.0)
        );
        assert_eq!(reduce(RedOp::Min, Dtype::Uint32, &[3, 7, 1]), Value::Int(1));
        assert_eq!(
            decode(Dtype::Bfloat16, &encode(Dtype::Bfloat16, Value::Float(2.5))),
            2.5
        );
        assert_eq!(
            decode(Dtype::Half, &encode(Dtype::Half, Value::Float(1e6))),
            f64::INFINITY
        );
    }

    #[test]
    fn avg_tolerance_accepts_rounding_not_corruption() {
        let c = Collective::AllReduce.counts(64, 2, 3);
        let segs = expected_segments(Collective::AllReduce, Dtype::Half, RedOp::Avg, 0, 3, 0, &c);
        let tol = tolerance(Dtype::Half, RedOp::Avg);
        let mut out = vec![0u8; c.recv * 2];
        fill(&mut out, &segs[0]);
        // Nudge element 0 by one unit in the last place: accepted.
        let v = f16::from_le_bytes([out[0], out[1]]);
        let nudged = f16::from_bits(v.to_bits() + 1).to_le_bytes();
        out[..2].copy_from_slice(&nudged);
        assert_eq!(count_wrong(&out, Dtype::Half, &segs, tol), 0);
        out[2..4].copy_from_slice(&f16::from_f64(100.0).to_le_bytes());
        assert_eq!(count_wrong(&out, Dtype::Half, &segs, tol), 1);
        assert_eq!(tolerance(Dtype::Half, RedOp::Sum), None);
        assert_eq!(tolerance(Dtype::Int32, RedOp::Avg), None);
    }
}
