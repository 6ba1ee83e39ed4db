//! `ucx`: ucx_perftest's UCP tests; one figure per test (latency at the smallest size,
//! bandwidth at the largest), and the lanes UCX's log says it chose.

use serde::{Deserialize, Serialize};

use super::headline::{by_test, headline};
use super::{Judged, TestKind, lenient};
use crate::facts::NodeFacts;
use crate::params::ParamType::{Integer, IntegerList, String as Str, StringList};
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;
use crate::transport::{Finding, UcxEvidence, classify_ucx};

const GIB: f64 = (1u64 << 30) as f64;

pub const UCX_TESTS: &[&str] = &[
    "tag_lat",
    "tag_bw",
    "tag_sync_lat",
    "tag_sync_bw",
    "ucp_put_lat",
    "ucp_put_bw",
    "ucp_get",
    "stream_bw",
    "stream_lat",
    "ucp_am_lat",
    "ucp_am_bw",
];
pub const UCX_MEMORY: &[&str] = &["host", "cuda", "cuda-managed", "rocm"];

/// `ucx`: ucx_perftest's UCP tests between two processes (one node) or two nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UcxParams {
    pub tests: Vec<String>,
    pub sizes: Vec<u64>,
    pub iters: u64,
    pub warmup: u64,
    pub memory: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_host: Option<String>,
}

impl Default for UcxParams {
    fn default() -> Self {
        UcxParams {
            tests: vec!["tag_lat".into(), "tag_bw".into()],
            sizes: vec![8, 4096, 65536, 1 << 20],
            iters: 10_000,
            warmup: 1_000,
            memory: "host".into(),
            server_host: None,
        }
    }
}

impl KindParams for UcxParams {
    const KIND: &'static str = "ucx";
    const DESCRIPTION: &'static str = "ucx_perftest's UCP tests: latency and bandwidth over UCX, on one node or rank 0 to rank 1.";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("tests", StringList, "ucx_perftest tests to run.").choices(UCX_TESTS),
        ParamDoc::new("sizes", IntegerList, "Message sizes.")
            .unit("bytes")
            .range(1.0, GIB),
        ParamDoc::new("iters", Integer, "Iterations per test and size.")
            .unit("iterations")
            .range(1.0, 100_000_000.0),
        ParamDoc::new("warmup", Integer, "Untimed iterations.")
            .unit("iterations")
            .range(0.0, 100_000_000.0),
        ParamDoc::new("memory", Str, "Memory the buffers live in.").choices(UCX_MEMORY),
        ParamDoc::new(
            "server_host",
            Str,
            "Address of rank 0 (default: its hostname).",
        ),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if self.tests.is_empty() {
            return Err(ParamError::new("tests", "must not be empty"));
        }
        if self.sizes.is_empty() {
            return Err(ParamError::new("sizes", "must not be empty"));
        }
        Ok(())
    }
}

impl TestKind for UcxParams {
    type Summary = UcxSummary;

    /// One figure per perftest test in the rows (`op`).
    fn judged(&self, rows: &[ResultRow]) -> Judged {
        let tests = by_test(
            Self::KIND,
            rows,
            |r| r.op.clone(),
            |t| {
                if t.contains("_lat") {
                    "time_us"
                } else {
                    "algbw_gbs"
                }
            },
        );
        Judged {
            test: Self::KIND.into(),
            figures: tests
                .into_iter()
                .filter_map(|(test, metric, group)| {
                    headline(test, metric, group.into_iter(), false)
                })
                .collect(),
        }
    }

    fn path_line(summary: &UcxSummary) -> Option<String> {
        let ev = summary.ucx_evidence.as_ref()?;
        Some(format!(
            "UCX lanes: {}",
            if ev.selected.is_empty() {
                "none logged".to_string()
            } else {
                ev.selected.iter().cloned().collect::<Vec<_>>().join(", ")
            }
        ))
    }

    fn findings(summary: &UcxSummary, facts: Option<&NodeFacts>) -> Vec<Finding> {
        classify_ucx(summary.ucx_evidence.as_ref(), facts)
    }
}

/// What readers take from a `ucx` result's summary.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UcxSummary {
    /// What UCX's info log said about the lanes it chose.
    #[serde(default, deserialize_with = "lenient")]
    pub ucx_evidence: Option<UcxEvidence>,
}
