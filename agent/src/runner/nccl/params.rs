//! The `nccl` job's parameters (and `bench nccl`'s flags, which fill the same struct):
//! parsed, checked, and turned into the list of sizes actually run.

use std::time::Duration;

use heddle_types::kinds::nccl as wire;
use heddle_types::params::KindParams;
use serde_json::Value;

use super::spec::{self, Collective, Dtype, RedOp, Sweep};
use crate::runner::RunError;

pub use heddle_types::kinds::nccl::{MAX_BUDGET, parse_budget};

pub const MAX_BYTES_LIMIT: u64 = wire::NCCL_MAX_BYTES;
const MAX_ITERS: u64 = wire::NCCL_MAX_ITERS;

#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub coll: Collective,
    pub dtype: Dtype,
    pub redop: RedOp,
    pub root: usize,
    pub sweep: Sweep,
    pub warmup: u64,
    pub iters: u64,
    pub gpus: usize,
    pub check: bool,
    /// CUDA graph replays per sample; 0 launches one by one; `None` replays sizes up to
    /// [`super::timing::GRAPH_MAX_BYTES`] once from a graph and launches larger ones.
    pub graph: Option<u64>,
    /// Adaptive sampling within this budget; `None`: one sample of `iters`, as nccl-tests.
    pub budget: Option<Duration>,
    /// A row for every size of the sweep, as nccl-tests prints them (`heddle-agent
    /// bench`): a size whose per-rank count rounds to nothing gets a row of zeros, and a
    /// size that rounds to the previous one is measured again. Jobs leave it off: their
    /// stored rows are the sizes that moved data, each once.
    pub every_size: bool,
}

impl Default for Params {
    /// The wire type's defaults (`heddle_types::kinds::nccl`), which own them.
    fn default() -> Self {
        Params::from_wire(&wire::NcclParams::default())
            .expect("the nccl kind's default parameters are valid")
    }
}

impl Params {
    /// Decodes a job's params through the wire type the server checked them with.
    pub fn from_json(p: &Value) -> Result<Params, RunError> {
        let typed = wire::NcclParams::decode(p).map_err(|e| RunError::Params(e.to_string()))?;
        Params::from_wire(&typed)
    }

    pub fn from_wire(t: &wire::NcclParams) -> Result<Params, RunError> {
        let params = Params {
            coll: t.op.parse().map_err(RunError::Params)?,
            dtype: t.dtype.parse().map_err(RunError::Params)?,
            redop: t.redop.parse().map_err(RunError::Params)?,
            root: t.root as usize,
            sweep: Sweep {
                min_bytes: t.min_bytes,
                max_bytes: t.max_bytes,
                factor: t.factor,
                step_bytes: t.step_bytes,
            },
            warmup: t.warmup,
            iters: t.iters,
            gpus: t.gpus as usize,
            check: t.check,
            graph: t.graph,
            budget: t
                .budget
                .as_ref()
                .map(wire::DurationParam::duration)
                .transpose()
                .map_err(RunError::Params)?,
            every_size: false,
        };
        params.validate().map_err(RunError::Params)?;
        Ok(params)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.sweep.validate()?;
        if self.sweep.max_bytes > MAX_BYTES_LIMIT {
            return Err(format!(
                "max size ({}) is above the limit of {MAX_BYTES_LIMIT}",
                self.sweep.max_bytes
            ));
        }
        if self.iters == 0 || self.iters > MAX_ITERS {
            return Err(format!(
                "iters must be in 1..={MAX_ITERS}, got {}",
                self.iters
            ));
        }
        if self.warmup > MAX_ITERS {
            return Err(format!(
                "warmup must be at most {MAX_ITERS}, got {}",
                self.warmup
            ));
        }
        if self.gpus == 0 || self.gpus > 64 {
            return Err(format!("gpus must be in 1..=64, got {}", self.gpus));
        }
        if let Some(g) = self.graph
            && g > MAX_ITERS
        {
            return Err(format!(
                "graph must be at most {MAX_ITERS} replays, got {g}"
            ));
        }
        if let Some(b) = self.budget
            && (b.is_zero() || b > MAX_BUDGET)
        {
            return Err(format!(
                "budget must be above 0 and at most {} s, got {b:?}",
                MAX_BUDGET.as_secs()
            ));
        }
        Ok(())
    }

    /// The (size, counts) pairs actually run: sizes that round to the same element counts
    /// (or to nothing) are run once.
    pub fn plan(&self, nranks: usize) -> Vec<spec::Counts> {
        let mut out: Vec<spec::Counts> = Vec::new();
        for size in self.sweep.sizes() {
            let c = self.coll.counts(size, self.dtype.size(), nranks);
            if c.bytes == 0 || out.last().is_some_and(|l| l.bytes == c.bytes) {
                continue;
            }
            out.push(c);
        }
        out
    }

    /// Every size of the sweep in order, each with its counts and whether it is measured:
    /// with `every_size`, a size that moves nothing is listed unmeasured (nccl-tests prints
    /// it as a row of zeros); without it, the sizes of [`Params::plan`], all measured.
    pub fn steps(&self, nranks: usize) -> Vec<(spec::Counts, bool)> {
        if !self.every_size {
            return self.plan(nranks).into_iter().map(|c| (c, true)).collect();
        }
        self.sweep
            .sizes()
            .into_iter()
            .map(|size| {
                let c = self.coll.counts(size, self.dtype.size(), nranks);
                (c, c.bytes > 0)
            })
            .collect()
    }

    /// Whether an in-place variant exists. nccl-tests runs one for every collective;
    /// alltoall's would have NCCL read and write one buffer in any order, so it is left
    /// out here. Sendrecv's in-place sends from and receives into the same buffer, as
    /// nccl-tests does.
    pub fn has_in_place(&self) -> bool {
        !matches!(self.coll, Collective::AllToAll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_defaults_and_errors() {
        let p = Params::from_json(&json!({})).unwrap();
        assert_eq!(p, Params::default());
        assert_eq!(
            (
                p.coll,
                p.dtype,
                p.redop,
                p.sweep.min_bytes,
                p.sweep.max_bytes,
                p.sweep.factor
            ),
            (
                Collective::AllReduce,
                Dtype::Float,
                RedOp::Sum,
                8,
                128 << 20,
                2
            )
        );
        assert_eq!((p.warmup, p.iters, p.gpus, p.check), (5, 20, 1, true));
        let p = Params::from_json(&json!({
            "op": "reduce_scatter", "dtype": "bf16", "redop": "max", "min_bytes": 1024,
            "max_bytes": 1 << 30, "factor": 4, "warmup": 1, "iters": 3, "gpus": 8, "check": false
        }))
        .unwrap();
        assert_eq!(
            (p.coll, p.dtype, p.redop, p.gpus, p.check),
            (
                Collective::ReduceScatter,
                Dtype::Bfloat16,
                RedOp::Max,
                8,
                false
            )
        );
        assert_eq!(p.sweep.sizes().len(), 11);
        for bad in [
            json!({"op": "gossip"}),
            json!({"dtype": 4}),
            json!({"redop": "xor"}),
            json!({"min_bytes": 0}),
            json!({"max_bytes": 32u64 << 30}),
            json!({"iters": 0}),
            json!({"gpus": 0}),
            json!({"check": "yes"}),
            json!({"factor": 1}),
        ] {
            assert!(
                matches!(Params::from_json(&bad), Err(RunError::Params(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn plan_drops_sizes_that_round_to_nothing_or_repeat() {
        let p = Params {
            coll: Collective::AllGather,
            sweep: Sweep {
                min_bytes: 8,
                max_bytes: 256,
                factor: 2,
                step_bytes: None,
            },
            ..Params::default()
        };
        // 8 ranks × 16-byte chunks: nothing below 128 B moves.
        let sizes: Vec<u64> = p.plan(8).iter().map(|c| c.bytes).collect();
        assert_eq!(sizes, vec![128, 256]);
        let p = Params {
            coll: Collective::AllReduce,
            ..p
        };
        assert_eq!(p.plan(8).len(), 6);
        assert!(p.has_in_place());
        assert!(
            !Params {
                coll: Collective::AllToAll,
                ..p
            }
            .has_in_place()
        );
        assert!(
            Params {
                coll: Collective::SendRecv,
                ..p
            }
            .has_in_place()
        );
    }

    #[test]
    fn every_size_keeps_the_rows_nccl_tests_prints() {
        let p = Params {
            coll: Collective::AllGather,
            sweep: Sweep {
                min_bytes: 8,
                max_bytes: 64,
                factor: 2,
                step_bytes: None,
            },
            ..Params::default()
        };
        let seen = |p: &Params| -> Vec<(u64, usize, bool)> {
            p.steps(2)
                .iter()
                .map(|(c, m)| (c.bytes, c.param, *m))
                .collect()
        };
        // Two ranks of floats: 8 and 16 B give each rank less than 16 bytes, so nothing.
        assert_eq!(seen(&p), vec![(32, 4, true), (64, 8, true)]);
        let every = Params {
            every_size: true,
            ..p
        };
        assert_eq!(
            seen(&every),
            vec![(0, 0, false), (0, 0, false), (32, 4, true), (64, 8, true)]
        );
    }

    #[test]
    fn budgets_parse_as_durations_or_seconds() {
        assert_eq!(parse_budget("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_budget("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_budget("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_budget("1.5").unwrap(), Duration::from_millis(1500));
        for bad in ["", "-1", "ten seconds", "10 parsecs"] {
            assert!(parse_budget(bad).is_err(), "{bad}");
        }
        let p = Params::from_json(&json!({"budget": "10s", "graph": 4})).unwrap();
        assert_eq!(
            (p.budget, p.graph),
            (Some(Duration::from_secs(10)), Some(4))
        );
        let p = Params::from_json(&json!({"budget": 2.5})).unwrap();
        assert_eq!(p.budget, Some(Duration::from_millis(2500)));
        for bad in [
            json!({"budget": "0s"}),
            json!({"budget": "2h"}),
            json!({"budget": true}),
            json!({"graph": 1_000_000}),
        ] {
            assert!(
                matches!(Params::from_json(&bad), Err(RunError::Params(_))),
                "{bad}"
            );
        }
    }
}
