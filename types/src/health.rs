//! "Is this normal?": verdicts on results, expectations, node and fleet health, pre-flight.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How a result (or a node, or a set of nodes) was judged. Ordered from best to worst as
/// a launcher reads it: `unknown` ranks between `warn` and `fail` when verdicts are
/// combined (see [`Verdict::combine`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Warn,
    Fail,
    /// Nothing to compare with, or no result (yet).
    Unknown,
}

impl Verdict {
    pub const ALL: [Verdict; 4] = [
        Verdict::Pass,
        Verdict::Warn,
        Verdict::Fail,
        Verdict::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
            Verdict::Unknown => "unknown",
        }
    }

    /// The value of the `heddle_health_verdict` gauge: 0 pass, 1 warn, 2 fail, -1 unknown.
    pub fn gauge(self) -> i64 {
        match self {
            Verdict::Pass => 0,
            Verdict::Warn => 1,
            Verdict::Fail => 2,
            Verdict::Unknown => -1,
        }
    }

    fn rank(self) -> u8 {
        match self {
            Verdict::Pass => 0,
            Verdict::Warn => 1,
            Verdict::Unknown => 2,
            Verdict::Fail => 3,
        }
    }

    /// The verdict of a set: any fail fails it; otherwise one node that could not be
    /// judged makes the set undecided; otherwise any warning warns. Empty sets are unknown.
    pub fn combine(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
        verdicts
            .into_iter()
            .max_by_key(|v| v.rank())
            .unwrap_or(Verdict::Unknown)
    }
}

impl std::str::FromStr for Verdict {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Verdict::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| format!("unknown verdict {s:?}"))
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much a reason weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warn,
    Fail,
}

/// One reason behind a verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Reason {
    pub severity: Severity,
    pub message: String,
    /// `<test>/<metric>` the reason is about, e.g. `nccl.all_reduce/busbw_gbs`.
    #[serde(default)]
    pub metric: Option<String>,
    #[serde(default)]
    pub observed: Option<f64>,
    #[serde(default)]
    pub expected: Option<f64>,
    /// `expectation:<source>`, `node-baseline`, `fleet-median`, `validation`, `outcome` or
    /// `transport`.
    pub basis: String,
    /// A stable name for scripts (`socket-fallback`, `below-port-rate`, ...); see
    /// `heddle_types::transport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The tool's own line the reason rests on, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

/// One figure a result was judged on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Figure {
    /// `<kind>.<test>`: `nccl.all_reduce`, `rdma.ib_write_bw`, `p2p.h2d`, `memcpy`.
    pub test: String,
    /// `busbw_gbs`, `algbw_gbs`, `rdma_speedup` or `time_us` (lower is better).
    pub metric: String,
    /// The message size the figure was measured at.
    pub size_bytes: i64,
    pub value: f64,
    /// The copy a per-pair figure is of (`p2p`: `0-1` from GPU 0 to GPU 1, `host-0`,
    /// `0-host`, `0-1 bidir` both ways at once; see [`pair_name`]). Such a figure is
    /// followed for regressions only, never judged; absent from every other figure, whose
    /// JSON stays as it was before pairs existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<String>,
}

/// The name of the copy from `src` to `dst` (a GPU index or `host`) in a per-pair figure;
/// both directions at once (`bidir`) name the pair once, lower end first.
pub fn pair_name(src: &str, dst: &str, bidir: bool) -> String {
    if !bidir {
        return format!("{src}-{dst}");
    }
    let key = |s: &str| (s.parse::<u64>().unwrap_or(u64::MAX), s.to_string());
    let (a, b) = if key(src) <= key(dst) {
        (src, dst)
    } else {
        (dst, src)
    };
    format!("{a}-{b} bidir")
}

/// The verdict on one stored result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResultVerdict {
    pub result_id: Uuid,
    pub verdict: Verdict,
    /// The result's main test (`nccl.all_reduce`); a result with several (p2p, ucx) names
    /// its kind.
    pub test: String,
    /// The headline figure: its metric and value.
    pub metric: Option<String>,
    pub value: Option<f64>,
    /// Worst first.
    pub reasons: Vec<Reason>,
    #[serde(default)]
    pub figures: Vec<Figure>,
    pub judged_at: DateTime<Utc>,
}

/// The latest verdict of one test on one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestHealth {
    pub test: String,
    pub verdict: Verdict,
    pub metric: Option<String>,
    pub value: Option<f64>,
    pub reasons: Vec<Reason>,
    pub result_id: Uuid,
    pub run_id: Uuid,
    pub world_size: i32,
    pub judged_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeHealth {
    pub node_id: Uuid,
    pub hostname: String,
    /// The combination of the latest verdict of every test and of the node's checks that
    /// warn or fail.
    pub verdict: Verdict,
    pub tests: Vec<TestHealth>,
    /// The node's checks that warn or fail (`heddle_types::node_checks`), worst first; their
    /// `code` is the check's name.
    #[serde(default)]
    pub reasons: Vec<Reason>,
}

/// One node in the fleet summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeHealthLine {
    pub node_id: Uuid,
    pub hostname: String,
    pub gpu_model: Option<String>,
    pub verdict: Verdict,
    /// Tests whose latest verdict is warn or fail.
    pub failing: Vec<String>,
    pub last_judged_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetHealth {
    pub pass: i64,
    pub warn: i64,
    pub fail: i64,
    /// Nodes never judged, or whose tests had nothing to compare with.
    pub unknown: i64,
    /// Worst first.
    pub nodes: Vec<NodeHealthLine>,
}

/// What a figure is expected to reach: at least `value` (at most, for `time_us`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Expectation {
    /// Set for operator-defined expectations (the id to delete them by).
    pub id: Option<Uuid>,
    /// `builtin`, `plugin` or `operator`.
    pub origin: String,
    pub test: String,
    pub metric: String,
    /// Applies to figures measured at this size or larger.
    pub min_size_bytes: i64,
    pub value: f64,
    /// Where the figure comes from: a datasheet, a published table, a measurement.
    pub source: String,
    /// Applies to nodes whose GPU model contains this (case-insensitive).
    pub gpu_model: Option<String>,
    /// Applies to runs of this many GPUs in all (NCCL ranks).
    pub gpu_count: Option<i32>,
    /// Applies to runs over this many nodes.
    pub world_size: Option<i32>,
    /// Applies to this node only (hostname).
    pub node: Option<String>,
    pub created_by: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
}

/// An operator's expectation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExpectationCreate {
    /// `<kind>.<test>`, e.g. `nccl.all_reduce`, `rdma.ib_write_bw`, `memcpy`.
    pub test: String,
    /// `busbw_gbs`, `algbw_gbs`, `time_us`, or `rdma_speedup` (an `rdma_ab` result's
    /// RDMA busbw over its socket busbw).
    pub metric: String,
    /// At least this (GB/s, or a ratio), or at most this for `time_us`.
    pub value: f64,
    /// Why this figure: a datasheet, an acceptance test, a measurement.
    pub source: String,
    #[serde(default)]
    pub min_size_bytes: Option<i64>,
    #[serde(default)]
    pub gpu_model: Option<String>,
    #[serde(default)]
    pub gpu_count: Option<i32>,
    #[serde(default)]
    pub world_size: Option<i32>,
    /// Node id or hostname.
    #[serde(default)]
    pub node: Option<String>,
}

/// Which check pre-flight runs on nodes without a fresh verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PreflightCheck {
    /// Single-node NCCL all_reduce over all GPUs (`nccl.all_reduce`).
    #[default]
    Nccl,
    /// Host memory copy (`memcpy`).
    Memcpy,
    /// perftest `ib_write_bw` in loopback (`rdma.ib_write_bw`).
    Rdma,
    /// GPU copies d2d/h2d/d2h (`p2p.*`).
    P2p,
}

impl PreflightCheck {
    pub const ALL: [PreflightCheck; 4] = [
        PreflightCheck::Nccl,
        PreflightCheck::Memcpy,
        PreflightCheck::Rdma,
        PreflightCheck::P2p,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PreflightCheck::Nccl => "nccl",
            PreflightCheck::Memcpy => "memcpy",
            PreflightCheck::Rdma => "rdma",
            PreflightCheck::P2p => "p2p",
        }
    }
}

impl std::str::FromStr for PreflightCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PreflightCheck::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown check {s:?} (nccl, memcpy, rdma or p2p)"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PreflightRequest {
    /// Node ids or hostnames (1 to 4096).
    pub nodes: Vec<String>,
    /// Verdicts older than this are stale (default 3600).
    #[serde(default)]
    pub max_age_s: Option<u32>,
    #[serde(default)]
    pub check: Option<PreflightCheck>,
    /// How long to wait for fresh checks on stale nodes (default 120, at most 600; 0 only
    /// reads history).
    #[serde(default)]
    pub wait_s: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PreflightNode {
    pub node: String,
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
    /// `history` (a fresh enough verdict), `fresh-run` (a check run now) or `none`.
    pub from: String,
    pub result_id: Option<Uuid>,
    pub run_id: Option<Uuid>,
    pub judged_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PreflightResponse {
    pub verdict: Verdict,
    pub check: PreflightCheck,
    pub nodes: Vec<PreflightNode>,
}

#[cfg(test)]
mod tests {
    use super::Verdict::*;
    use super::*;

    #[test]
    fn combining_verdicts() {
        assert_eq!(Verdict::combine([Pass, Pass]), Pass);
        assert_eq!(Verdict::combine([Pass, Warn]), Warn);
        assert_eq!(Verdict::combine([Warn, Unknown]), Unknown);
        assert_eq!(Verdict::combine([Unknown, Fail, Pass]), Fail);
        assert_eq!(Verdict::combine([]), Unknown);
    }

    #[test]
    fn names_round_trip() {
        for v in Verdict::ALL {
            assert_eq!(v.as_str().parse::<Verdict>().unwrap(), v);
            assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
        }
        for c in PreflightCheck::ALL {
            assert_eq!(c.as_str().parse::<PreflightCheck>().unwrap(), c);
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
        assert!("ncc".parse::<PreflightCheck>().is_err());
    }

    /// Figures stored before pairs existed, and every figure without one, keep their JSON to
    /// the byte; a pair is one more field, read back as it was written.
    #[test]
    fn a_figure_without_a_pair_serializes_as_before() {
        let f = Figure {
            test: "nccl.all_reduce".into(),
            metric: "busbw_gbs".into(),
            size_bytes: 8 << 30,
            value: 345.5,
            pair: None,
        };
        let before = r#"{"test":"nccl.all_reduce","metric":"busbw_gbs","size_bytes":8589934592,"value":345.5}"#;
        assert_eq!(serde_json::to_string(&f).unwrap(), before);
        assert_eq!(serde_json::from_str::<Figure>(before).unwrap(), f);
        let paired = Figure {
            test: "p2p.d2d".into(),
            metric: "algbw_gbs".into(),
            pair: Some("0-1".into()),
            ..f
        };
        let text = serde_json::to_string(&paired).unwrap();
        assert_eq!(
            text,
            r#"{"test":"p2p.d2d","metric":"algbw_gbs","size_bytes":8589934592,"value":345.5,"pair":"0-1"}"#
        );
        assert_eq!(serde_json::from_str::<Figure>(&text).unwrap(), paired);
    }

    #[test]
    fn pair_names() {
        assert_eq!(pair_name("0", "1", false), "0-1");
        assert_eq!(pair_name("1", "0", false), "1-0");
        assert_eq!(pair_name("host", "3", false), "host-3");
        // Both directions at once are one pair, named from its lower GPU, 2 before 10.
        assert_eq!(pair_name("1", "0", true), "0-1 bidir");
        assert_eq!(pair_name("10", "2", true), "2-10 bidir");
        assert_eq!(pair_name("2", "10", true), "2-10 bidir");
    }
}
