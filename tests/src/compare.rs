//! A load generator report held against a stored one (`heddle-loadgen --compare`): each
//! figure of the agent protocol as the ratio of now to then, so a regression is seen the
//! day it lands. The baseline is either one report (`heddle-loadgen --json`) or the file
//! `scripts/bench-protocol.sh` writes (`{"cases": [report, ...]}`), of which the case with
//! the same agents and replicas is used.

use serde_json::Value;

/// A latency figure whose ratio is above this is called worse (and counted by
/// [`Comparison::worse`]); the runs of one commit on this kind of machine differ by up to
/// about 1.5× in their p99s.
pub const WORSE_ABOVE: f64 = 1.5;

/// The figures compared: a label and a path into the report. Latencies (lower is better)
/// and the request rate (higher is better: its ratio is inverted so that above 1 is worse
/// for every line).
const FIGURES: &[(&str, &[&str], bool)] = &[
    (
        "heartbeat p50 ms",
        &["latency", "heartbeat", "p50_ms"],
        true,
    ),
    (
        "heartbeat p99 ms",
        &["latency", "heartbeat", "p99_ms"],
        true,
    ),
    ("claim p50 ms", &["latency", "claim", "p50_ms"], true),
    ("claim p99 ms", &["latency", "claim", "p99_ms"], true),
    ("result p50 ms", &["latency", "result", "p50_ms"], true),
    ("result p99 ms", &["latency", "result", "p99_ms"], true),
    ("enroll p99 ms", &["latency", "enroll", "p99_ms"], true),
    ("facts p99 ms", &["latency", "facts", "p99_ms"], true),
    ("set-up s", &["setup_s"], true),
    ("requests/s", &["requests_per_s"], false),
];

/// One figure then and now; `ratio` is now / then (then / now for a rate), so above 1 is
/// worse; `None` where either side lacks the figure or it is zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub figure: &'static str,
    pub then: Option<f64>,
    pub now: Option<f64>,
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub lines: Vec<Line>,
    /// Errors then and now (any error now is worse, whatever the ratio).
    pub errors: (u64, u64),
}

impl Comparison {
    /// Latency lines worse than [`WORSE_ABOVE`], plus one if there are new errors.
    pub fn worse(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.ratio.is_some_and(|r| r > WORSE_ABOVE))
            .count()
            + usize::from(self.errors.1 > self.errors.0)
    }

    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "errors": {"baseline": self.errors.0, "now": self.errors.1},
            "worse": self.worse(),
            "figures": self.lines.iter().map(|l| serde_json::json!({
                "figure": l.figure, "baseline": l.then, "now": l.now, "ratio": l.ratio,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn print(&self) {
        println!(
            "{:<18} {:>11} {:>11} {:>7}",
            "against baseline", "baseline", "now", "ratio"
        );
        let num = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        for l in &self.lines {
            let flag = if l.ratio.is_some_and(|r| r > WORSE_ABOVE) {
                "  worse"
            } else {
                ""
            };
            println!(
                "{:<18} {:>11} {:>11} {:>7}{flag}",
                l.figure,
                num(l.then),
                num(l.now),
                l.ratio.map_or("-".to_string(), |r| format!("{r:.2}x"))
            );
        }
        println!("errors: baseline {}, now {}", self.errors.0, self.errors.1);
    }
}

/// Why a baseline cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BaselineError {
    #[error(
        "the baseline is not a load generator report nor a file of them (no \"cases\" and no \"agents\")"
    )]
    NotAReport,
    #[error(
        "the baseline has no case of {agents} agents and {replicas} replica(s); it has: {have}"
    )]
    NoSuchCase {
        agents: u64,
        replicas: u64,
        have: String,
    },
}

fn case_of(report: &Value) -> (u64, u64) {
    (
        report["agents"].as_u64().unwrap_or(0),
        report["replicas"].as_u64().unwrap_or(1),
    )
}

/// The report in `baseline` of the same case as `now`.
pub fn pick<'a>(baseline: &'a Value, now: &Value) -> Result<&'a Value, BaselineError> {
    let (agents, replicas) = case_of(now);
    let cases: Vec<&Value> = match (baseline.get("cases"), baseline.get("agents")) {
        (Some(Value::Array(c)), _) => c.iter().collect(),
        (None, Some(_)) => vec![baseline],
        _ => return Err(BaselineError::NotAReport),
    };
    cases
        .iter()
        .find(|c| case_of(c) == (agents, replicas))
        .copied()
        .ok_or_else(|| BaselineError::NoSuchCase {
            agents,
            replicas,
            have: cases
                .iter()
                .map(|c| {
                    let (a, r) = case_of(c);
                    format!("{a}x{r}")
                })
                .collect::<Vec<_>>()
                .join(", "),
        })
}

fn at(report: &Value, path: &[&str]) -> Option<f64> {
    path.iter()
        .try_fold(report, |v, k| v.get(k))
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite())
}

/// `now` against `then`, figure by figure.
pub fn compare(then: &Value, now: &Value) -> Comparison {
    let lines = FIGURES
        .iter()
        .map(|&(figure, path, lower_is_better)| {
            let (a, b) = (at(then, path), at(now, path));
            let ratio = match (a, b) {
                (Some(a), Some(b)) if lower_is_better && a > 0.0 => Some(b / a),
                (Some(a), Some(b)) if !lower_is_better && b > 0.0 => Some(a / b),
                _ => None,
            };
            Line {
                figure,
                then: a,
                now: b,
                ratio,
            }
        })
        .collect();
    let errors = |r: &Value| r["errors"].as_u64().unwrap_or(0);
    Comparison {
        lines,
        errors: (errors(then), errors(now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(agents: u64, hb_p99: f64, rps: f64, errors: u64) -> Value {
        json!({"agents": agents, "replicas": 1, "errors": errors, "requests_per_s": rps, "setup_s": 20.0,
               "latency": {"heartbeat": {"p50_ms": 0.5, "p99_ms": hb_p99}, "claim": {"p50_ms": 1.0, "p99_ms": 0.0}}})
    }

    #[test]
    fn ratios_say_worse_above_one_for_latencies_and_rates() {
        let c = compare(
            &report(10_000, 5.0, 1000.0, 0),
            &report(10_000, 20.0, 500.0, 0),
        );
        let get = |f: &str| c.lines.iter().find(|l| l.figure == f).unwrap().clone();
        assert_eq!(get("heartbeat p99 ms").ratio, Some(4.0));
        assert_eq!(get("heartbeat p50 ms").ratio, Some(1.0));
        // Half the rate is twice as bad.
        assert_eq!(get("requests/s").ratio, Some(2.0));
        // A zero baseline and a missing figure give no ratio rather than infinity.
        assert_eq!(get("claim p99 ms").ratio, None);
        assert_eq!(get("result p99 ms").ratio, None);
        assert_eq!(c.worse(), 2);
    }

    #[test]
    fn new_errors_are_worse_whatever_the_latencies() {
        let c = compare(
            &report(10_000, 5.0, 1000.0, 0),
            &report(10_000, 5.0, 1000.0, 3),
        );
        assert_eq!(c.worse(), 1);
        assert_eq!(c.errors, (0, 3));
    }

    #[test]
    fn the_case_is_picked_by_agents_and_replicas() {
        let file =
            json!({"cases": [report(10_000, 5.0, 1000.0, 0), report(50_000, 30.0, 5000.0, 0)]});
        let now = report(50_000, 31.0, 5000.0, 0);
        assert_eq!(pick(&file, &now).unwrap()["agents"], 50_000);
        // One report is its own case.
        let one = report(10_000, 5.0, 1000.0, 0);
        assert_eq!(
            pick(&one, &report(10_000, 1.0, 1.0, 0)).unwrap()["agents"],
            10_000
        );
        let err = pick(&file, &report(2_000, 1.0, 1.0, 0)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the baseline has no case of 2000 agents and 1 replica(s); it has: 10000x1, 50000x1"
        );
        assert_eq!(
            pick(&json!({"x": 1}), &now).unwrap_err(),
            BaselineError::NotAReport
        );
    }
}
