//! `memcpy`: host memory copy bandwidth over a size sweep; needs no GPU. Judged on its
//! bandwidth at the largest size.

use serde::{Deserialize, Serialize};

use super::headline::headline;
use super::{Judged, TestKind};
use crate::params::ParamType::{Integer, Number};
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;

const GIB: f64 = (1u64 << 30) as f64;

/// `memcpy`: host memory copy bandwidth; needs no GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemcpyParams {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub factor: f64,
    pub iters: u64,
}

impl Default for MemcpyParams {
    fn default() -> Self {
        MemcpyParams {
            min_bytes: 1 << 10,
            max_bytes: 64 << 20,
            factor: 2.0,
            iters: 20,
        }
    }
}

impl KindParams for MemcpyParams {
    const KIND: &'static str = "memcpy";
    const DESCRIPTION: &'static str = "Host memory copy bandwidth over a size sweep; needs no GPU.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("min_bytes", Integer, "Smallest copy.")
            .unit("bytes")
            .range(1.0, GIB),
        ParamDoc::new("max_bytes", Integer, "Largest copy.")
            .unit("bytes")
            .range(1.0, GIB),
        ParamDoc::new("factor", Number, "Size multiplier between steps (> 1).").range(1.0, 1024.0),
        ParamDoc::new("iters", Integer, "Copies per size.")
            .unit("iterations")
            .range(1.0, 1_000_000.0),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if self.max_bytes < self.min_bytes {
            return Err(ParamError::new(
                "max_bytes",
                format!("{} is below min_bytes ({})", self.max_bytes, self.min_bytes),
            ));
        }
        if self.factor <= 1.0 {
            return Err(ParamError::new(
                "factor",
                format!("must be > 1, got {}", self.factor),
            ));
        }
        Ok(())
    }
}

impl TestKind for MemcpyParams {
    type Summary = ();

    fn judged(&self, rows: &[ResultRow]) -> Judged {
        Judged {
            test: Self::KIND.into(),
            figures: headline(Self::KIND.into(), "algbw_gbs", rows.iter(), false)
                .into_iter()
                .collect(),
        }
    }
}
