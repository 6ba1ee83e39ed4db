//! `sleep`: waits, reporting progress; exercises cancellation and leases without hardware.

use serde::{Deserialize, Serialize};

use super::{Judged, TestKind};
use crate::params::ParamType::Number;
use crate::params::{KindParams, ParamDoc};
use crate::rows::ResultRow;

/// `sleep`: waits, reporting progress; exercises cancellation and leases without hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepParams {
    pub seconds: f64,
    /// Stops reporting progress after this many seconds while it keeps waiting: a test
    /// that hangs, for trying the agent's stall watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_after_s: Option<f64>,
}

impl KindParams for SleepParams {
    const KIND: &'static str = "sleep";
    const DESCRIPTION: &'static str =
        "Waits, reporting progress every second; for trying cancellation, leases and timeouts.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("seconds", Number, "How long to wait.")
            .unit("s")
            .range(0.0, 86_400.0)
            .required(),
        ParamDoc::new(
            "silent_after_s",
            Number,
            "Stop reporting progress after this long while still waiting (a test that hangs).",
        )
        .unit("s")
        .range(0.0, 86_400.0),
    ];
}

impl TestKind for SleepParams {
    type Summary = ();

    /// Measures nothing: judged on its outcome alone.
    fn judged(&self, _rows: &[ResultRow]) -> Judged {
        Judged {
            test: Self::KIND.into(),
            figures: Vec::new(),
        }
    }
}
