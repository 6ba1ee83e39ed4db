//! The line protocol between an investigation's planner and whatever runs its tests (a
//! fabric model, or a bridge to real agents), one JSON object per line:
//!
//! - planner → oracle: `{"round": N, "tests": [{"id": "t1", "kind": "all_reduce", "nodes":
//!   ["n001", ...], "rail": 3 | null, "bytes": 1073741824}, ...]}` ([`RoundRequest`]);
//! - oracle → planner: `{"round": N, "results": [{"id": "t1", "busbw_gbs": 41.2} | {"id":
//!   "t1", "error": "hung"}, ...]}`, each with an optional `"seconds"` ([`RoundResults`]);
//! - planner → oracle when it is done: `{"done": true}`;
//! - and the planner's [`Answer`]: `{"blamed": [{"component", "id", "confidence",
//!   "evidence"}], "rounds": R, "tests": T, "node_seconds": S, ...}`.

use serde::{Deserialize, Serialize};

use super::index::Kind;

/// The only kind of test the planner asks for.
pub const ALL_REDUCE: &str = "all_reduce";
/// What a test moves: 1 GiB, large enough for bus bandwidth to show the path.
pub const TEST_BYTES: u64 = 1 << 30;
/// The longest line either side may write, in bytes.
pub const MAX_LINE_BYTES: usize = 64 << 20;
/// Node-seconds counted for a result that does not say how long it took.
pub const DEFAULT_SECONDS: f64 = 30.0;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestSpec {
    pub id: String,
    pub kind: String,
    pub nodes: Vec<String>,
    /// `None` (JSON `null`): every rail of the nodes at once.
    pub rail: Option<u32>,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundRequest {
    pub round: u32,
    pub tests: Vec<TestSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestResult {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundResults {
    pub round: u32,
    pub results: Vec<TestResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    pub done: bool,
}

/// What an oracle reads: a round, or the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToOracle {
    Done(Done),
    Round(RoundRequest),
}

/// One component the planner names, with how sure it is and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Blame {
    pub component: Kind,
    pub id: String,
    pub confidence: f64,
    pub evidence: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// What the evidence names with at least the planner's confidence.
    pub blamed: Vec<Blame>,
    pub rounds: u32,
    pub tests: u32,
    pub node_seconds: f64,
    /// `false`: some failures are not explained with confidence; `candidates` says by what
    /// they might be.
    pub conclusive: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Blame>,
    /// Why it stopped, and what it could not map.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The slowest round's planning, in milliseconds.
    pub max_planning_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_shapes_are_the_documented_ones() {
        let req = RoundRequest {
            round: 1,
            tests: vec![TestSpec {
                id: "t1".into(),
                kind: ALL_REDUCE.into(),
                nodes: vec!["n001".into(), "n002".into()],
                rail: None,
                bytes: TEST_BYTES,
            }],
        };
        assert_eq!(
            serde_json::to_string(&req).unwrap(),
            r#"{"round":1,"tests":[{"id":"t1","kind":"all_reduce","nodes":["n001","n002"],"rail":null,"bytes":1073741824}]}"#
        );
        let res: RoundResults = serde_json::from_str(
            r#"{"round": 1, "results": [{"id": "t1", "busbw_gbs": 41.2}, {"id": "t2", "error": "hung", "seconds": 60}]}"#,
        )
        .unwrap();
        assert_eq!(res.results[0].busbw_gbs, Some(41.2));
        assert_eq!(res.results[1].error.as_deref(), Some("hung"));
        assert_eq!(
            serde_json::to_string(&Done { done: true }).unwrap(),
            r#"{"done":true}"#
        );
        let b = Blame {
            component: Kind::Uplink,
            id: "a~b".into(),
            confidence: 0.99,
            evidence: vec![],
        };
        assert!(
            serde_json::to_string(&b)
                .unwrap()
                .contains(r#""component":"uplink""#)
        );
    }
}
