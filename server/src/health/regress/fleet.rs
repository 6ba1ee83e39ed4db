//! The fleet around a change: did comparable nodes move the same way at the same time, and
//! what do the ones that moved have in common that the others lack ("12 nodes lost 6–8 %,
//! all moved driver 550 → 560; 0 of 40 that did not upgrade moved").

use std::collections::{BTreeSet, HashSet};

use chrono::{DateTime, Duration, Utc};
use heddle_types::regress::{FLEET_WINDOW_DAYS, FactChange, FleetView, SharedChange, facts_diff};
use sqlx::PgPool;
use uuid::Uuid;

use crate::health::HealthError;

/// Comparable nodes are looked for this many days either side of a change.
const PEER_WINDOW_DAYS: i64 = 30;
/// At most this many peers' facts are compared.
const MAX_PEERS: i64 = 5000;
/// At most this many members of a cohort have their view refreshed when one joins; the
/// rest are refreshed when their own series next changes.
const MAX_COHORT: i64 = 50;

struct Subject {
    node_id: Uuid,
    test: String,
    metric: String,
    size_band: i32,
    world_size: i32,
    /// A p2p pair's series compares with the same pair on other nodes; '' for the rest.
    pair: String,
    t: DateTime<Utc>,
    worse: bool,
    facts_changes: sqlx::types::Json<Vec<FactChange>>,
}

struct Moved {
    node_id: Uuid,
    hostname: String,
    relative_change: f64,
    facts_changes: sqlx::types::Json<Vec<FactChange>>,
}

/// Refreshes the fleet view of change `id` and of the other changes the same way of its
/// cohort (same series key, GPU pair included, within [`FLEET_WINDOW_DAYS`]).
pub async fn refresh_cohort(db: &PgPool, id: Uuid) -> Result<(), HealthError> {
    let cohort = sqlx::query_scalar!(
        "SELECT o.id FROM change_points c JOIN change_points o
           ON o.test = c.test AND o.metric = c.metric AND o.size_band = c.size_band AND o.world_size = c.world_size
          AND o.pair = c.pair AND o.worse = c.worse AND o.t BETWEEN c.t - make_interval(days => $2) AND c.t + make_interval(days => $2)
         WHERE c.id = $1 ORDER BY (o.id = $1) DESC, o.t DESC LIMIT $3",
        id,
        FLEET_WINDOW_DAYS as i32,
        MAX_COHORT,
    )
    .fetch_all(db)
    .await?;
    for member in cohort {
        refresh(db, member).await?;
    }
    Ok(())
}

async fn refresh(db: &PgPool, id: Uuid) -> Result<(), HealthError> {
    let Some(s) = sqlx::query_as!(
        Subject,
        r#"SELECT node_id, test, metric, size_band, world_size, pair, t, worse,
                facts_changes AS "facts_changes: sqlx::types::Json<Vec<FactChange>>"
         FROM change_points WHERE id = $1"#,
        id,
    )
    .fetch_optional(db)
    .await?
    else {
        return Ok(());
    };
    let window = Duration::days(FLEET_WINDOW_DAYS);
    let moved = sqlx::query_as!(
        Moved,
        r#"SELECT DISTINCT ON (c.node_id) c.node_id, n.hostname, c.relative_change,
                c.facts_changes AS "facts_changes: sqlx::types::Json<Vec<FactChange>>"
         FROM change_points c JOIN nodes n ON n.id = c.node_id
         WHERE c.test = $1 AND c.metric = $2 AND c.size_band = $3 AND c.world_size = $4 AND c.worse = $5
           AND c.t BETWEEN $6 AND $7 AND c.pair = $9
         ORDER BY c.node_id, abs(extract(epoch FROM c.t - $8))"#,
        s.test,
        s.metric,
        s.size_band,
        s.world_size,
        s.worse,
        s.t - window,
        s.t + window,
        s.t,
        s.pair,
    )
    .fetch_all(db)
    .await?;
    // Nodes with comparable figures on both sides of the change.
    let peers = sqlx::query_scalar!(
        "SELECT node_id FROM series_points
         WHERE world_size = $1 AND test = $2 AND metric = $3 AND band = $4 AND pair = $8
           AND t BETWEEN $5::timestamptz - make_interval(days => $6)
                     AND $5::timestamptz + make_interval(days => $6)
         GROUP BY node_id HAVING min(t) < $5 AND max(t) >= $5
         LIMIT $7",
        s.world_size,
        s.test,
        s.metric,
        s.size_band,
        s.t,
        PEER_WINDOW_DAYS as i32,
        MAX_PEERS,
        s.pair,
    )
    .fetch_all(db)
    .await?;
    let moved_ids: HashSet<Uuid> = moved.iter().map(|m| m.node_id).collect();
    let unmoved: Vec<Uuid> = peers
        .into_iter()
        .filter(|p| !moved_ids.contains(p) && *p != s.node_id)
        .collect();
    let unmoved_changes = facts_changes_around(db, &unmoved, s.t, window).await?;
    let view = view(&s, &moved, &unmoved_changes);
    let json = serde_json::to_value(&view).map_err(|source| HealthError::Decode {
        what: "fleet view",
        source,
    })?;
    sqlx::query!(
        "UPDATE change_points SET fleet = $2 WHERE id = $1",
        id,
        json
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Each node's facts changes between `window` before `t` (or its earliest facts, when it
/// has none that old) and `window` after.
async fn facts_changes_around(
    db: &PgPool,
    nodes: &[Uuid],
    t: DateTime<Utc>,
    window: Duration,
) -> Result<Vec<Vec<FactChange>>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT coalesce(
                    (SELECT facts FROM node_facts_history h WHERE h.node_id = p.id AND h.collected_at <= $2 ORDER BY h.id DESC LIMIT 1),
                    (SELECT facts FROM node_facts_history h WHERE h.node_id = p.id ORDER BY h.id LIMIT 1)) AS "before?",
                (SELECT facts FROM node_facts_history h WHERE h.node_id = p.id AND h.collected_at <= $3 ORDER BY h.id DESC LIMIT 1) AS "after?"
         FROM unnest($1::uuid[]) AS p(id)"#,
        nodes,
        t - window,
        t + window,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| match (r.before, r.after) {
            (Some(a), Some(b)) => {
                facts_diff::diff(&facts_diff::fields(&a), &facts_diff::fields(&b))
            }
            _ => Vec::new(),
        })
        .collect())
}

/// Same field, moved to the same value.
fn same(a: &FactChange, b: &FactChange) -> bool {
    a.field == b.field && a.after == b.after
}

fn view(s: &Subject, moved: &[Moved], unmoved: &[Vec<FactChange>]) -> FleetView {
    let changes: Vec<f64> = moved.iter().map(|m| m.relative_change).collect();
    let mut shared: Vec<SharedChange> = s
        .facts_changes
        .0
        .iter()
        .map(|c| SharedChange {
            change: c.clone(),
            moved_with_change: moved
                .iter()
                .filter(|m| m.facts_changes.0.iter().any(|o| same(o, c)))
                .count() as i64,
            moved: moved.len() as i64,
            unmoved_with_change: unmoved
                .iter()
                .filter(|u| u.iter().any(|o| same(o, c)))
                .count() as i64,
            unmoved: unmoved.len() as i64,
        })
        .collect();
    // Most telling first: shared by the most nodes that moved, the fewest that did not.
    shared.sort_by_key(|c| {
        (
            std::cmp::Reverse(c.moved_with_change),
            c.unmoved_with_change,
        )
    });
    let hosts: BTreeSet<&str> = moved.iter().map(|m| m.hostname.as_str()).collect();
    FleetView {
        compared: (moved.len() + unmoved.len()) as i64,
        moved: moved.len() as i64,
        moved_nodes: hosts.iter().take(20).map(|h| h.to_string()).collect(),
        moved_low: changes.iter().copied().reduce(f64::min),
        moved_high: changes.iter().copied().reduce(f64::max),
        shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(before: &str, after: &str) -> FactChange {
        FactChange {
            field: "software.nvidia_driver".into(),
            before: Some(before.into()),
            after: Some(after.into()),
        }
    }

    #[test]
    fn the_fleet_splits_on_the_driver_the_nodes_that_moved_share() {
        let kernel = FactChange {
            field: "host.kernel".into(),
            before: Some("6.8.0-45".into()),
            after: Some("6.8.0-49".into()),
        };
        let s = Subject {
            node_id: Uuid::nil(),
            test: "nccl.all_reduce".into(),
            metric: "busbw_gbs".into(),
            size_band: 33,
            world_size: 1,
            pair: String::new(),
            t: Utc::now(),
            worse: true,
            facts_changes: sqlx::types::Json(vec![kernel.clone(), driver("550", "560")]),
        };
        let moved: Vec<Moved> = (0..12)
            .map(|i| Moved {
                node_id: Uuid::from_u128(i),
                hostname: format!("gpu-{i:02}"),
                relative_change: -0.06 - 0.002 * i as f64,
                // Upgraded from different drivers, to the same one.
                facts_changes: sqlx::types::Json(vec![driver(
                    if i % 2 == 0 { "550" } else { "535" },
                    "560",
                )]),
            })
            .collect();
        // 40 that did not move: 3 changed their kernel, none the driver.
        let unmoved: Vec<Vec<FactChange>> = (0..40)
            .map(|i| if i < 3 { vec![kernel.clone()] } else { vec![] })
            .collect();
        let v = view(&s, &moved, &unmoved);
        assert_eq!((v.compared, v.moved), (52, 12));
        assert_eq!(v.moved_nodes.len(), 12);
        assert!((v.moved_low.unwrap() + 0.082).abs() < 1e-9);
        assert!((v.moved_high.unwrap() + 0.06).abs() < 1e-9);
        // The driver first: all 12 that moved share it, none of the 40 that did not.
        assert_eq!(v.shared[0].change.field, "software.nvidia_driver");
        assert_eq!((v.shared[0].moved_with_change, v.shared[0].moved), (12, 12));
        assert_eq!(
            (v.shared[0].unmoved_with_change, v.shared[0].unmoved),
            (0, 40)
        );
        assert_eq!(
            (
                v.shared[1].moved_with_change,
                v.shared[1].unmoved_with_change
            ),
            (0, 3)
        );
    }
}
