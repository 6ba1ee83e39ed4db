//! The environment a run's tests get on each node: the node's effective environment
//! (plugin recommendations, then site tuning profiles, then node tuning profiles: what
//! `heddle env NODE` exports), with the run's own `env` on top, each variable with its
//! source. Heddle's own tests then run the way jobs will.

use std::collections::BTreeMap;

use heddle_types::jobs::{EnvVar, RUN_ENV_SOURCE};
use heddle_types::nodes::Recommendation;
use uuid::Uuid;

use crate::db;

/// A tuning profile's name, variables, and whether it is the node's own (else its site's).
type ProfileRow = (String, sqlx::types::Json<BTreeMap<String, String>>, bool);

/// Recommendations, overridden by site tuning profiles, overridden by node tuning
/// profiles; sorted by name. The one implementation of that order (`heddle env` reads it
/// through `api::nodes::effective_env`).
pub async fn effective(
    conn: &mut sqlx::PgConnection,
    node: Uuid,
) -> Result<Vec<Recommendation>, sqlx::Error> {
    let recs: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT name, value, reason, source FROM recommendations WHERE node_id = $1 ORDER BY source, name",
    )
    .bind(node)
    .fetch_all(&mut *conn)
    .await?;
    let profiles: Vec<ProfileRow> = sqlx::query_as(
        "SELECT p.name, p.env, p.node_id IS NOT NULL FROM tuning_profiles p
         WHERE p.node_id = $1 OR p.site_id = (SELECT site_id FROM nodes WHERE id = $1)
         ORDER BY p.node_id IS NOT NULL, p.created_at",
    )
    .bind(node)
    .fetch_all(&mut *conn)
    .await?;
    let mut merged: BTreeMap<String, Recommendation> = BTreeMap::new();
    for (name, value, reason, source) in recs {
        merged.insert(
            name.clone(),
            Recommendation {
                name,
                value,
                reason,
                source,
            },
        );
    }
    for (profile, env, node_level) in profiles {
        let scope = if node_level { "node" } else { "site" };
        for (name, value) in env.0 {
            let reason = format!("chosen by {scope} tuning profile {profile:?}");
            merged.insert(
                name.clone(),
                Recommendation {
                    name,
                    value,
                    reason,
                    source: format!("tuning:{profile}"),
                },
            );
        }
    }
    Ok(merged.into_values().collect())
}

/// The node's environment under the run's own, sorted by name. A recommended variable
/// that the run-env policy (`db::check_env`) refuses is left out and logged: a bad
/// recommendation must not stop every run on the node.
pub fn layer(node: &[Recommendation], run: &BTreeMap<String, String>) -> Vec<EnvVar> {
    let mut out: BTreeMap<String, EnvVar> = BTreeMap::new();
    for r in node {
        let one = BTreeMap::from([(r.name.clone(), r.value.clone())]);
        if let Err(e) = db::check_env(&one) {
            tracing::warn!(name = %r.name, source = %r.source, error = %e, "recommended variable left out of a run");
            continue;
        }
        out.insert(
            r.name.clone(),
            EnvVar {
                name: r.name.clone(),
                value: r.value.clone(),
                source: r.source.clone(),
            },
        );
    }
    for (name, value) in run {
        out.insert(
            name.clone(),
            EnvVar {
                name: name.clone(),
                value: value.clone(),
                source: RUN_ENV_SOURCE.into(),
            },
        );
    }
    out.into_values().collect()
}

/// What a job of the run gets on `node`; `recommended` false keeps the run's env only.
pub async fn applied(
    conn: &mut sqlx::PgConnection,
    node: Uuid,
    run: &BTreeMap<String, String>,
    recommended: bool,
) -> Result<Vec<EnvVar>, sqlx::Error> {
    let node_env = if recommended {
        effective(conn, node).await?
    } else {
        Vec::new()
    };
    Ok(layer(&node_env, run))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, value: &str, source: &str) -> Recommendation {
        Recommendation {
            name: name.into(),
            value: value.into(),
            reason: String::new(),
            source: source.into(),
        }
    }

    #[test]
    fn the_run_env_wins_and_sources_are_kept() {
        let node = [
            rec("NCCL_IB_HCA", "mlx5_0", "plugin:runai-roce@0.2.0"),
            rec("NCCL_IB_GID_INDEX", "3", "tuning:site-a"),
            rec("NOT-A-NAME", "x", "plugin:bad@1"),
        ];
        let run = BTreeMap::from([("NCCL_IB_HCA".to_string(), "mlx5_1".to_string())]);
        let env = layer(&node, &run);
        let got: Vec<(&str, &str, &str)> = env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_str(), e.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("NCCL_IB_GID_INDEX", "3", "tuning:site-a"),
                ("NCCL_IB_HCA", "mlx5_1", "run"),
            ]
        );
        assert_eq!(layer(&[], &run).len(), 1);
    }
}
