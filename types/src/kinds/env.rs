//! `env`: reports the variables a test process really gets on the node.

use serde::{Deserialize, Serialize};

use super::{Judged, TestKind};
use crate::params::{KindParams, ParamDoc};
use crate::rows::ResultRow;

/// `env`: takes no parameters.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvParams {}

impl KindParams for EnvParams {
    const KIND: &'static str = "env";
    const DESCRIPTION: &'static str = "Reports the NCCL/UCX/CUDA variables a test process really gets on the node; measures nothing.";
    const PARAMS: &'static [ParamDoc] = &[];
}

impl TestKind for EnvParams {
    type Summary = ();

    /// Measures nothing: judged on its outcome alone.
    fn judged(&self, _rows: &[ResultRow]) -> Judged {
        Judged {
            test: Self::KIND.into(),
            figures: Vec::new(),
        }
    }
}
