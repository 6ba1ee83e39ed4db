//! A node's named checks ([`heddle_types::node_checks`]) evaluated on its stored facts,
//! with the report before them from the facts history (counter deltas, Xid events since
//! the last report) and the other nodes of its site (IPoIB subnets). Evaluated when read,
//! so a rule change applies to every node at once and nothing is stored twice.

use heddle_types::facts::NodeFacts;
use heddle_types::health::{Reason, Verdict};
use heddle_types::node_checks::{self, NodeCheck};
use sqlx::PgPool;
use uuid::Uuid;

use super::HealthError;

/// Every check of a node, in the order the rules give them; empty before its first facts.
pub async fn for_node(db: &PgPool, node_id: Uuid) -> Result<Vec<NodeCheck>, HealthError> {
    let row = sqlx::query!(
        "SELECT hostname, facts, site_id FROM nodes WHERE id = $1",
        node_id
    )
    .fetch_optional(db)
    .await?
    .map(|r| (r.hostname, r.facts, r.site_id));
    let Some((hostname, Some(facts), site_id)) = row else {
        return Ok(Vec::new());
    };
    let facts: NodeFacts = match serde_json::from_value(facts) {
        Ok(f) => f,
        Err(e) => {
            return Ok(vec![NodeCheck {
                name: "facts".into(),
                subject: None,
                state: Verdict::Unknown,
                reason: format!("the node's facts do not decode, so nothing was checked: {e}"),
            }]);
        }
    };
    // The newest history row is these facts (a change is always recorded); the one
    // before it is the previous report.
    let previous = sqlx::query_scalar!(
        "SELECT facts FROM node_facts_history WHERE node_id = $1 ORDER BY id DESC OFFSET 1 LIMIT 1",
        node_id,
    )
    .fetch_optional(db)
    .await?;
    let previous: Option<NodeFacts> = previous.and_then(|v| serde_json::from_value(v).ok());
    let mut checks = node_checks::evaluate(&facts, previous.as_ref());
    if let Some(site) = site_id {
        // Only the interfaces are needed, so the rest of each peer's facts stays in Postgres.
        let peers = sqlx::query!(
            r#"SELECT hostname, jsonb_build_object('network', facts->'network') AS "facts!"
             FROM nodes WHERE site_id = $1 AND id <> $2 AND facts IS NOT NULL"#,
            site,
            node_id,
        )
        .fetch_all(db)
        .await?;
        let peers: Vec<(String, NodeFacts)> = peers
            .into_iter()
            .filter_map(|p| Some((p.hostname, network_only(p.facts)?)))
            .collect();
        let mut site_facts: Vec<(String, &NodeFacts)> =
            peers.iter().map(|(h, f)| (h.clone(), f)).collect();
        site_facts.push((hostname.clone(), &facts));
        checks.extend(node_checks::ipoib_subnets(&hostname, &site_facts));
    }
    Ok(checks)
}

/// Node facts holding only `network` (the rest defaulted), for the site-wide checks.
fn network_only(v: serde_json::Value) -> Option<NodeFacts> {
    let network = serde_json::from_value(v.get("network")?.clone()).ok()?;
    Some(NodeFacts {
        schema_version: heddle_types::facts::FACTS_SCHEMA_VERSION,
        collected_at: chrono::Utc::now(),
        live: false,
        host: Default::default(),
        cpu: Default::default(),
        pci: Vec::new(),
        nvml: not_read(),
        gpus: Vec::new(),
        rdma: heddle_types::facts::RdmaFacts {
            sysfs: not_read(),
            verbs: not_read(),
            devices: Vec::new(),
        },
        network,
        software: Default::default(),
        topology: heddle_types::facts::Topology {
            devices: Vec::new(),
            matrix: Vec::new(),
            gpu_affinity: Vec::new(),
            nvlink_source: String::new(),
        },
        gpudirect: None,
        conditions: None,
        errors: Vec::new(),
    })
}

fn not_read() -> heddle_types::facts::Probe {
    heddle_types::facts::Probe {
        state: heddle_types::facts::ProbeState::NotConsulted,
        message: String::new(),
    }
}

/// The verdict reasons of the checks that warn or fail, worst first.
pub fn reasons(checks: &[NodeCheck]) -> Vec<Reason> {
    let mut r: Vec<Reason> = checks.iter().filter_map(NodeCheck::to_reason).collect();
    r.sort_by_key(|x| std::cmp::Reverse(x.severity));
    r
}

/// What the checks add to a node's verdict: warn or fail when one does; pass and unknown
/// checks leave the tests' verdict alone (a node without NVML is not a worse node).
pub fn verdicts(checks: &[NodeCheck]) -> impl Iterator<Item = Verdict> + '_ {
    checks
        .iter()
        .map(|c| c.state)
        .filter(|v| matches!(v, Verdict::Warn | Verdict::Fail))
}
