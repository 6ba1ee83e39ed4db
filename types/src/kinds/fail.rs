//! `fail`: fails on purpose, to try failure reporting end to end.

use serde::{Deserialize, Serialize};

use super::{Judged, TestKind};
use crate::params::ParamType::{Integer, String as Str};
use crate::params::{KindParams, ParamDoc};
use crate::rows::ResultRow;

/// `fail`: fails on purpose, to try failure reporting end to end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailParams {
    pub exit_code: u64,
    pub message: String,
}

impl Default for FailParams {
    fn default() -> Self {
        FailParams {
            exit_code: 1,
            message: "requested failure".into(),
        }
    }
}

impl KindParams for FailParams {
    const KIND: &'static str = "fail";
    const DESCRIPTION: &'static str = "Fails on purpose with a message and exit code.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("exit_code", Integer, "Exit status of the test.").range(1.0, 255.0),
        ParamDoc::new("message", Str, "What the test writes to stderr."),
    ];
}

impl TestKind for FailParams {
    type Summary = ();

    /// Measures nothing: judged on its outcome alone.
    fn judged(&self, _rows: &[ResultRow]) -> Judged {
        Judged {
            test: Self::KIND.into(),
            figures: Vec::new(),
        }
    }
}
