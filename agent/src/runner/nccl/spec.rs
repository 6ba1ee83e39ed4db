//! What an NCCL benchmark measures, independent of any GPU: collectives, data types,
//! reduction ops, the size sweep, how many elements each rank moves, and the bus-bandwidth
//! factors. All of it follows nccl-tests so that our tables can be compared with theirs
//! line by line (see nccl-tests' `doc/PERFORMANCE.md`).

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Collective {
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// Whether the collective takes a reduction op (the others print `none`).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether nccl-tests prints the reduction op in the `redop` column: it passes the `-o`
    /// op to the reducing collectives and to sendrecv, and `none` to the others.
    pub fn prints_redop(self) -> bool {
        self.reduces() || self == Collective::SendRecv
    }

    /// Whether its output can be checked when run in place. A sendrecv in place sends and
    /// receives through one buffer while the peer writes into it: what it holds afterwards
    /// is not defined, and nccl-tests does not count it (`#wrong` is `N/A`).
    pub fn checked_in_place(self) -> bool {
        self != Collective::SendRecv
    }

    /// Whether the collective has a root (the others print `-1`).
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// busbw / algbw, from nccl-tests' PERFORMANCE.md: the fraction of the data that must
    /// cross the slowest link, so that busbw is comparable with the hardware peak
    /// whatever the rank count.
    /// (The one rule, shared with observed jobs: `heddle_types::collective::bus_factor`.)
    pub fn bus_factor(self, nranks: usize) -> f64 {
        heddle_types::collective::bus_factor(self.name(), u32::try_from(nranks).unwrap_or(u32::MAX))
    }

    /// Element counts for a nominal `size_bytes`, as nccl-tests' `*GetCollByteCount`: the
    /// per-peer chunk of gather/scatter/alltoall is rounded down to 16 bytes so every
    /// rank's slice stays aligned, so the size actually moved can be below the nominal one.
    pub fn counts(self, size_bytes: u64, elem: usize, nranks: usize) -> Counts {
        let elem = elem as u64;
        let n = nranks.max(1) as u64;
        let count = size_bytes / elem;
        let align = (16 / elem).max(1);
        let chunk = (count / n) / align * align;
        let (send, recv, param) = match self {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv => (count, count, count),
            Collective::AllGather => (chunk, chunk * n, chunk),
            Collective::ReduceScatter => (chunk * n, chunk, chunk),
            Collective::AllToAll => (chunk * n, chunk * n, chunk),
        };
        // What the size column shows: the larger buffer, as nccl-tests prints it.
        let bytes = send.max(recv) * elem;
        Counts {
            send: send as usize,
            recv: recv as usize,
            param: param as usize,
            bytes,
        }
    }
}

/// How many elements one rank sends and receives for one size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub send: usize,
    pub recv: usize,
    /// The count passed to NCCL (per peer for gather/scatter/alltoall).
    pub param: usize,
    /// The size column, and the numerator of algbw.
    pub bytes: u64,
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = heddle_types::collective::canonical_collective(s)?;
        Ok(Collective::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .expect("every canonical collective has a variant"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Half,
    Float,
    Double,
    Bfloat16,
}

impl Dtype {
    pub const ALL: [Dtype; 10] = [
        Dtype::Int8,
        Dtype::Uint8,
        Dtype::Int32,
        Dtype::Uint32,
        Dtype::Int64,
        Dtype::Uint64,
        Dtype::Half,
        Dtype::Float,
        Dtype::Double,
        Dtype::Bfloat16,
    ];

    /// The name nccl-tests prints in its `type` column.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
            Dtype::Int64 => "int64",
            Dtype::Uint64 => "uint64",
            Dtype::Half => "half",
            Dtype::Float => "float",
            Dtype::Double => "double",
            Dtype::Bfloat16 => "bfloat16",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::Int8 | Dtype::Uint8 => 1,
            Dtype::Half | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float => 4,
            Dtype::Int64 | Dtype::Uint64 | Dtype::Double => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::Half | Dtype::Float | Dtype::Double | Dtype::Bfloat16
        )
    }
}

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = heddle_types::kinds::nccl::canonical_dtype(s)?;
        Ok(Dtype::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .expect("every canonical data type has a variant"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl RedOp {
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }
}

impl FromStr for RedOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = heddle_types::kinds::nccl::canonical_redop(s)?;
        Ok(RedOp::ALL
            .into_iter()
            .find(|o| o.name() == name)
            .expect("every canonical reduction op has a variant"))
    }
}

/// Parses a size as nccl-tests does: a number with an optional K, M or G suffix (powers
/// of 1024), e.g. `8`, `128K`, `8G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size {s:?}: expected e.g. 8, 256K, 128M, 8G"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// The size sweep: `min`, then ×`factor` (or +`step` when a step is given) up to `max`
/// inclusive, as nccl-tests' `-b/-e/-f/-i`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sweep {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: u64,
    pub step_bytes: Option<u64>,
}

impl Sweep {
    pub fn validate(&self) -> Result<(), String> {
        if self.min_bytes == 0 {
            return Err("min size must be at least 1 byte".into());
        }
        if self.max_bytes < self.min_bytes {
            return Err(format!(
                "max size ({}) is below min size ({})",
                self.max_bytes, self.min_bytes
            ));
        }
        match self.step_bytes {
            Some(0) => Err("step must be at least 1 byte".into()),
            None if self.factor < 2 => Err(format!("factor must be >= 2, got {}", self.factor)),
            _ => Ok(()),
        }
    }

    pub fn sizes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            out.push(size);
            let next = match self.step_bytes {
                Some(step) => size.checked_add(step),
                None => size.checked_mul(self.factor.max(2)),
            };
            match next {
                Some(n) => size = n,
                None => break,
            }
        }
        out
    }
}

/// Bandwidths for one measurement, in GB/s (10⁹ bytes per second, as nccl-tests).
pub fn bandwidths(coll: Collective, bytes: u64, time_us: f64, nranks: usize) -> (f64, f64) {
    if time_us <= 0.0 {
        return (0.0, 0.0);
    }
    let algbw = bytes as f64 / (time_us * 1e-6) / 1e9;
    (algbw, algbw * coll.bus_factor(nranks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_factors_follow_performance_md() {
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::ReduceScatter.bus_factor(8), 0.875);
        assert_eq!(Collective::AllToAll.bus_factor(2), 0.5);
        for c in [
            Collective::Broadcast,
            Collective::Reduce,
            Collective::SendRecv,
        ] {
            assert_eq!(c.bus_factor(16), 1.0);
        }
        assert_eq!(Collective::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn counts_match_nccl_tests() {
        // all_reduce: the whole buffer on every rank.
        let c = Collective::AllReduce.counts(1 << 20, 4, 8);
        assert_eq!(
            (c.send, c.recv, c.param, c.bytes),
            (262144, 262144, 262144, 1 << 20)
        );
        // all_gather of 8 floats over 2 ranks: 4 per rank, aligned to 16 bytes.
        let c = Collective::AllGather.counts(32, 4, 2);
        assert_eq!((c.send, c.recv, c.param, c.bytes), (4, 8, 4, 32));
        // Too small to give each rank a 16-byte chunk: nothing moves.
        let c = Collective::AllGather.counts(8, 4, 2);
        assert_eq!((c.send, c.recv, c.bytes), (0, 0, 0));
        // reduce_scatter of 100 floats over 3 ranks: 33 → 32 per rank.
        let c = Collective::ReduceScatter.counts(400, 4, 3);
        assert_eq!((c.send, c.recv, c.param, c.bytes), (96, 32, 32, 384));
        let c = Collective::AllToAll.counts(1024, 2, 4);
        assert_eq!((c.send, c.recv, c.param, c.bytes), (512, 512, 128, 1024));
        // A size that is not a multiple of the element size is truncated.
        assert_eq!(Collective::Broadcast.counts(10, 4, 2).bytes, 8);
    }

    #[test]
    fn sweeps() {
        let s = Sweep {
            min_bytes: 8,
            max_bytes: 8 << 30,
            factor: 2,
            step_bytes: None,
        };
        let sizes = s.sizes();
        assert_eq!(sizes.len(), 31);
        assert_eq!(sizes[0], 8);
        assert_eq!(*sizes.last().unwrap(), 8 << 30);
        let s = Sweep {
            min_bytes: 1000,
            max_bytes: 3500,
            factor: 2,
            step_bytes: Some(1000),
        };
        assert_eq!(s.sizes(), vec![1000, 2000, 3000]);
        let s = Sweep {
            min_bytes: 3,
            max_bytes: 100,
            factor: 10,
            step_bytes: None,
        };
        assert_eq!(s.sizes(), vec![3, 30]);
        assert!(
            Sweep {
                min_bytes: 0,
                max_bytes: 1,
                factor: 2,
                step_bytes: None
            }
            .validate()
            .is_err()
        );
        assert!(
            Sweep {
                min_bytes: 9,
                max_bytes: 8,
                factor: 2,
                step_bytes: None
            }
            .validate()
            .is_err()
        );
        assert!(
            Sweep {
                min_bytes: 1,
                max_bytes: 8,
                factor: 1,
                step_bytes: None
            }
            .validate()
            .is_err()
        );
        assert!(
            Sweep {
                min_bytes: 1,
                max_bytes: 8,
                factor: 1,
                step_bytes: Some(0)
            }
            .validate()
            .is_err()
        );
        assert!(
            Sweep {
                min_bytes: 1,
                max_bytes: 8,
                factor: 1,
                step_bytes: Some(2)
            }
            .validate()
            .is_ok()
        );
        // No overflow at the top of u64.
        let s = Sweep {
            min_bytes: 1 << 62,
            max_bytes: u64::MAX,
            factor: 4,
            step_bytes: None,
        };
        assert_eq!(s.sizes(), vec![1 << 62]);
    }

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("128K").unwrap(), 128 << 10);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size("8GB").unwrap(), 8 << 30);
        assert!(parse_size("8T").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn names_parse_and_round_trip() {
        let names: Vec<_> = Collective::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names, heddle_types::collective::COLLECTIVES);
        for c in Collective::ALL {
            assert_eq!(c.name().parse::<Collective>().unwrap(), c);
        }
        assert_eq!(
            "allreduce".parse::<Collective>().unwrap(),
            Collective::AllReduce
        );
        assert_eq!(
            "all-gather".parse::<Collective>().unwrap(),
            Collective::AllGather
        );
        assert!("gossip".parse::<Collective>().is_err());
        for d in Dtype::ALL {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
        }
        assert_eq!("bf16".parse::<Dtype>().unwrap(), Dtype::Bfloat16);
        assert_eq!("fp32".parse::<Dtype>().unwrap(), Dtype::Float);
        assert!("float8".parse::<Dtype>().is_err());
        for o in RedOp::ALL {
            assert_eq!(o.name().parse::<RedOp>().unwrap(), o);
        }
        assert!("xor".parse::<RedOp>().is_err());
    }

    #[test]
    fn bandwidth_arithmetic() {
        // 1 GB in 1 s over 2 ranks: algbw 1 GB/s, all_reduce busbw 1 GB/s.
        let (alg, bus) = bandwidths(Collective::AllReduce, 1_000_000_000, 1e6, 2);
        assert!((alg - 1.0).abs() < 1e-12 && (bus - 1.0).abs() < 1e-12);
        let (alg, bus) = bandwidths(Collective::AllGather, 8 << 30, 25_000.0, 8);
        assert!((alg - 343.597_383_68).abs() < 1e-6, "{alg}");
        assert!((bus - alg * 0.875).abs() < 1e-9);
        assert_eq!(bandwidths(Collective::Reduce, 8, 0.0, 2), (0.0, 0.0));
    }
}
