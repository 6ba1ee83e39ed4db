//! The one place that turns what was recommended for a node (plugin outputs, an operator's
//! own sources, site and node tuning profiles) into its environment, by the rule of
//! `heddle_types::recommend`, keeping what each winner overrode. The env export, the node
//! detail, `GET /api/v1/nodes/{node}/env/explain` and the environment applied to a run's
//! tests (`runs_env`) all read it from here.

use std::collections::BTreeMap;

use heddle_types::nodes::Recommendation;
use heddle_types::recommend::{Candidate, ExplainedVar, Rank, resolve};
use uuid::Uuid;

/// A tuning profile that covers the node: name, env, and whether it is the node's own.
type ProfileRow = (String, sqlx::types::Json<BTreeMap<String, String>>, bool);

/// Every variable of the node's environment, sorted by name, with its source, reason and
/// the values it overrode.
pub async fn explain(
    conn: &mut sqlx::PgConnection,
    node: Uuid,
) -> Result<Vec<ExplainedVar>, sqlx::Error> {
    let recs: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT name, value, reason, source FROM recommendations WHERE node_id = $1 ORDER BY source, name",
    )
    .bind(node)
    .fetch_all(&mut *conn)
    .await?;
    let profiles: Vec<ProfileRow> = sqlx::query_as(
        "SELECT p.name, p.env, p.node_id IS NOT NULL FROM tuning_profiles p
             WHERE p.node_id = $1 OR p.site_id = (SELECT site_id FROM nodes WHERE id = $1)
             ORDER BY p.node_id IS NOT NULL, p.created_at, p.name",
    )
    .bind(node)
    .fetch_all(&mut *conn)
    .await?;
    let mut candidates: Vec<Candidate> = recs
        .into_iter()
        .map(|(name, value, reason, source)| Candidate {
            rank: Rank::of_source(&source),
            name,
            value,
            reason,
            source,
        })
        .collect();
    for (seq, (profile, env, node_level)) in profiles.into_iter().enumerate() {
        let scope = if node_level { "node" } else { "site" };
        for (name, value) in env.0 {
            candidates.push(Candidate {
                name,
                value,
                reason: format!("chosen by {scope} tuning profile {profile:?}"),
                source: format!("tuning:{profile}"),
                rank: Rank::profile(node_level, seq as u64),
            });
        }
    }
    Ok(resolve(candidates))
}

/// The environment a job on this node should run with: the winners of [`explain`].
pub async fn effective(
    conn: &mut sqlx::PgConnection,
    node: Uuid,
) -> Result<Vec<Recommendation>, sqlx::Error> {
    Ok(explain(conn, node)
        .await?
        .into_iter()
        .map(|v| Recommendation {
            name: v.name,
            value: v.value,
            reason: v.reason,
            source: v.source,
        })
        .collect())
}
