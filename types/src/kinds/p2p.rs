//! `p2p`: copy bandwidth between the GPUs of one node and between each GPU and the host;
//! one figure per copy kind (`d2d`, `h2d`, `d2h`, the worst pair's), and one per GPU pair
//! for regressions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::headline::{by_test, headline, headline_size, pick};
use super::{Judged, TestKind};
use crate::health::{Figure, pair_name};
use crate::params::ParamType::{Boolean, Integer, IntegerList};
use crate::params::{KindParams, ParamDoc, ParamError};
use crate::rows::ResultRow;

const GIB: f64 = (1u64 << 30) as f64;

/// `p2p`: copy bandwidth between the GPUs of one node and between each GPU and the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct P2pParams {
    pub size: u64,
    pub warmup: u64,
    pub iters: u64,
    pub bidirectional: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<u64>>,
}

impl Default for P2pParams {
    fn default() -> Self {
        P2pParams {
            size: 256 << 20,
            warmup: 5,
            iters: 20,
            bidirectional: false,
            gpus: None,
        }
    }
}

impl KindParams for P2pParams {
    const KIND: &'static str = "p2p";
    const DESCRIPTION: &'static str =
        "GPU↔GPU and host↔GPU copy bandwidth on one node (a GPU×GPU matrix).";
    const PARAMS: &'static [ParamDoc] = &[
        ParamDoc::new("size", Integer, "Bytes per copy.")
            .unit("bytes")
            .range(1.0, 16.0 * GIB),
        ParamDoc::new("warmup", Integer, "Untimed copies per pair.")
            .unit("iterations")
            .range(0.0, 100_000.0),
        ParamDoc::new("iters", Integer, "Timed copies per pair.")
            .unit("iterations")
            .range(1.0, 100_000.0),
        ParamDoc::new(
            "bidirectional",
            Boolean,
            "Also copy both directions of a pair at once.",
        ),
        ParamDoc::new(
            "gpus",
            IntegerList,
            "Device indices to measure (default: all).",
        )
        .range(0.0, 1023.0),
    ];

    fn check(&self) -> Result<(), ParamError> {
        if let Some(g) = &self.gpus {
            let mut sorted = g.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if g.is_empty() || sorted.len() != g.len() {
                return Err(ParamError::new(
                    "gpus",
                    format!("must list distinct devices, got {g:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// Rows by copy kind (`labels.kind`), each judged on its algbw.
fn by_copy_kind(rows: &[ResultRow]) -> Vec<(String, &'static str, Vec<&ResultRow>)> {
    by_test(
        P2pParams::KIND,
        rows,
        |r| r.labels.get("kind").cloned(),
        |_| "algbw_gbs",
    )
}

impl TestKind for P2pParams {
    type Summary = ();

    fn judged(&self, rows: &[ResultRow]) -> Judged {
        Judged {
            test: Self::KIND.into(),
            figures: by_copy_kind(rows)
                .into_iter()
                .filter_map(|(test, metric, group)| headline(test, metric, group.into_iter(), true))
                .collect(),
        }
    }

    /// One figure per copy (its `labels.src` → `labels.dst`, both ways at once for `mode`
    /// `bidir`), at the size its test's headline is taken at; repeats of a copy are
    /// averaged. These are what regressions follow per GPU pair: a degraded link between
    /// two GPUs is invisible in the worst pair's figure when another pair is slower still.
    /// They are never judged: the verdict stays on the worst pair.
    fn pairs(rows: &[ResultRow]) -> Vec<Figure> {
        let mut out = Vec::new();
        for (test, metric, group) in by_copy_kind(rows) {
            let Some(size) = headline_size(
                metric,
                group
                    .iter()
                    .filter(|r| pick(metric, r).is_some())
                    .map(|r| r.size_bytes),
            ) else {
                continue;
            };
            let mut copies: BTreeMap<String, (f64, u32)> = BTreeMap::new();
            for r in group.iter().filter(|r| r.size_bytes == size) {
                let (Some(src), Some(dst), Some(value)) = (
                    r.labels.get("src").filter(|s| !s.is_empty()),
                    r.labels.get("dst").filter(|s| !s.is_empty()),
                    pick(metric, r),
                ) else {
                    continue;
                };
                let bidir = r.labels.get("mode").is_some_and(|m| m == "bidir");
                let c = copies.entry(pair_name(src, dst, bidir)).or_default();
                *c = (c.0 + value, c.1 + 1);
            }
            out.extend(copies.into_iter().map(|(pair, (sum, n))| Figure {
                test: test.clone(),
                metric: metric.to_string(),
                size_bytes: size,
                value: sum / f64::from(n),
                pair: Some(pair),
            }));
        }
        out
    }
}
