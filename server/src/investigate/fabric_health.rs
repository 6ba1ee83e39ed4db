//! What fabric investigations say in a node's health: for a day after one finished, a
//! node whose traffic crosses something it blamed gets a reason naming it.

use heddle_types::fabric::index::Kind;
use heddle_types::health::{Reason, Severity};
use sqlx::types::Json;

use super::InvestigateError;
use super::fabric_store as store;

/// How long a blame counts in its nodes' health, as an observed job's verdict does.
const BLAME_HOURS: i64 = crate::health::observed::NODE_HEALTH_WINDOW_HOURS;

/// A node's health reasons from fabric investigations of the last day that blamed
/// something its traffic crosses: the node itself or one of its NICs fails it; a switch
/// or uplink it hangs off warns (the node is fine, its path is not).
pub async fn node_reasons(
    db: &sqlx::PgPool,
    hostname: &str,
) -> Result<Vec<Reason>, InvestigateError> {
    let mut out = Vec::new();
    for (id, Json(stored)) in store::blaming(db, hostname, BLAME_HOURS).await? {
        for p in &stored.blamed {
            if !p.covers(hostname) {
                continue;
            }
            let (severity, what) = match p.component {
                Kind::Node | Kind::Nic => (Severity::Fail, "this node's"),
                _ => (Severity::Warn, "a part its traffic crosses:"),
            };
            out.push(Reason {
                severity,
                message: format!(
                    "fabric investigation {id} blamed {what} {} ({:.0}% sure)",
                    p.place,
                    p.confidence * 100.0
                ),
                metric: None,
                observed: None,
                expected: None,
                basis: "fabric-investigation".into(),
                code: Some("fabric-blamed".into()),
                evidence: p.evidence.first().cloned(),
            });
        }
    }
    Ok(out)
}
