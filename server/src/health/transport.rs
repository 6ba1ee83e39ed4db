//! Transport reasons of a verdict: which path a test's bytes took, read from the evidence
//! the agent put in the result's summary (`nccl_evidence`, `ucx_evidence`) and judged
//! against the node's facts by each kind's module in `heddle_types::kinds`, with the
//! shared rules of `heddle_types::transport` (the same ones `heddle-agent check nccl-log`
//! applies). Rules: docs/health.md, "Transport".

use heddle_types::facts::NodeFacts;
use heddle_types::health::{Reason, Severity, Verdict};
use heddle_types::transport::{self, Finding, Level, NcclEvidence};
use serde_json::Value;

/// The node's facts as the shared rules read them; `None` when there are none or they
/// do not decode (an agent much older than this server): the facts-free rules still apply.
pub fn node_facts(facts: Option<&Value>) -> Option<NodeFacts> {
    let facts = facts?;
    match serde_json::from_value(facts.clone()) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(error = %e, "stored facts do not decode; transport rules without them");
            None
        }
    }
}

fn evidence<T: serde::de::DeserializeOwned>(summary: &Value, key: &str) -> Option<T> {
    serde_json::from_value(summary.get(key)?.clone()).ok()
}

/// What the evidence of a succeeded result of `kind` says, by the kind's module in
/// `heddle_types::kinds`. Kinds that record no transport (memcpy, p2p, sweep cells) have
/// nothing to say.
pub fn findings(kind: &str, summary: &Value, facts: Option<&NodeFacts>) -> Vec<Finding> {
    heddle_types::kinds::findings(kind, summary, facts)
}

/// The summed rate of the HCA ports an NCCL result's network channels used.
pub fn nccl_ports(summary: &Value, facts: Option<&NodeFacts>) -> Option<(f64, String)> {
    let ev: NcclEvidence = evidence(summary, "nccl_evidence")?;
    transport::nccl_used_ports(&ev, facts?)
}

/// The HCA and port a perftest result ran on, by perftest's own header (`Device`) and
/// the port it was started on.
pub fn perftest_port(summary: &Value) -> Option<(String, u32)> {
    let ev: transport::PerftestEvidence = evidence(summary, "perftest_evidence")?;
    Some((ev.device?, ev.port?))
}

pub fn reason(f: Finding) -> Reason {
    Reason {
        severity: match f.level {
            Level::Fail => Severity::Fail,
            Level::Warn => Severity::Warn,
            Level::Info => Severity::Info,
        },
        message: f.reason,
        metric: None,
        observed: None,
        expected: None,
        basis: "transport".into(),
        code: Some(f.code),
        evidence: f.evidence,
    }
}

/// Adds the transport findings to a verdict's reasons: the verdict becomes the worst
/// severity among them, and an "unknown" (nothing to compare the figures with) turns into
/// the transport's warn or fail, never into a pass.
pub fn merge(
    verdict: Verdict,
    mut reasons: Vec<Reason>,
    found: Vec<Finding>,
) -> (Verdict, Vec<Reason>) {
    if found.is_empty() {
        return (verdict, reasons);
    }
    reasons.extend(found.into_iter().map(reason));
    reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
    let worst = reasons.first().map(|r| r.severity);
    let verdict = match (worst, verdict) {
        (Some(Severity::Fail), _) => Verdict::Fail,
        (Some(Severity::Warn), Verdict::Pass | Verdict::Unknown) => Verdict::Warn,
        (_, v) => v,
    };
    (verdict, reasons)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pass() -> Vec<Reason> {
        Vec::new()
    }

    #[test]
    fn a_socket_fallback_fails_a_passing_result() {
        let summary =
            json!({"nccl_evidence": {"network": "Socket", "network_line": "Using network Socket"}});
        let facts = json!({
            "schema_version": 1, "collected_at": "2026-11-24T00:00:00Z", "live": false,
            "host": {"hostname": "n1", "os": {}, "dmi": {}, "container": {"kubernetes": false}},
            "cpu": {}, "nvml": {"state": "missing", "message": ""},
            "rdma": {"sysfs": {"state": "available", "message": ""}, "verbs": {"state": "missing", "message": ""},
                     "devices": [{"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}]}]},
            "network": {}, "software": {}, "topology": {"nvlink_source": "x"}
        });
        let facts = node_facts(Some(&facts));
        assert!(facts.is_some());
        let found = findings("nccl", &summary, facts.as_ref());
        let (v, r) = merge(Verdict::Pass, pass(), found);
        assert_eq!(v, Verdict::Fail);
        assert_eq!(r[0].code.as_deref(), Some("socket-fallback"));
        assert_eq!(r[0].evidence.as_deref(), Some("Using network Socket"));
        assert_eq!(r[0].basis, "transport");
        // The same result without facts: nothing to hold it against.
        let (v, _) = merge(Verdict::Pass, pass(), findings("nccl", &summary, None));
        assert_eq!(v, Verdict::Pass);
        assert!(
            heddle_types::kinds::path_line("nccl", &summary)
                .unwrap()
                .starts_with("network Socket")
        );
    }

    #[test]
    fn missing_evidence_warns_instead_of_passing() {
        let (v, r) = merge(Verdict::Pass, pass(), findings("nccl", &json!({}), None));
        assert_eq!(
            (v, r[0].code.as_deref()),
            (Verdict::Warn, Some("transport-unknown"))
        );
        let (v, _) = merge(Verdict::Unknown, pass(), findings("ucx", &json!({}), None));
        assert_eq!(v, Verdict::Warn);
        assert!(findings("memcpy", &json!({}), None).is_empty());
        assert_eq!(merge(Verdict::Fail, pass(), Vec::new()).0, Verdict::Fail);
    }
}
