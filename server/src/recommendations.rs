//! The one place that reads and writes what was recommended for a node (plugin outputs, an
//! operator's own sources, site and node tuning profiles) and turns it into its
//! environment, by the rule of `heddle_types::recommend`, keeping what each winner
//! overrode. The env export, the node detail, `GET /api/v1/nodes/{node}/env/explain` and the
//! environment applied to a run's tests (`runs_env`) all read it from here; the reconciler
//! and `PUT /api/v1/nodes/{node}/recommendations` write through it. A node's traits
//! (`node_traits`, merged into `nodes.traits`) follow the same rule and live here too.
//!
//! Rows a plugin wrote carry its `plugin_id`; the source text (`plugin:<name>@<version>`) is
//! only for people, never parsed back.

use std::collections::{BTreeMap, HashMap};

use heddle_types::nodes::{Recommendation, RecommendationSet};
use heddle_types::recommend::{Candidate, ExplainedVar, Rank, merge_traits, resolve};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::db::plugins::Enabled;

/// A tuning profile that covers a node: the node, the profile's name and env, and whether
/// it is the node's own.
type ProfileRow = (
    Uuid,
    String,
    sqlx::types::Json<BTreeMap<String, String>>,
    bool,
);

/// Every variable of the node's environment, sorted by name, with its source, reason and
/// the values it overrode.
pub async fn explain(
    conn: &mut PgConnection,
    node: Uuid,
) -> Result<Vec<ExplainedVar>, sqlx::Error> {
    let mut by_node = explain_many(conn, &[node], None).await?;
    Ok(by_node.remove(&node).unwrap_or_default())
}

/// [`explain`] of many nodes at once, limited to the variables `names` when given: two
/// queries whatever the number of nodes. Nodes with none of them map to an empty list.
pub async fn explain_many(
    conn: &mut PgConnection,
    nodes: &[Uuid],
    names: Option<&[&str]>,
) -> Result<HashMap<Uuid, Vec<ExplainedVar>>, sqlx::Error> {
    let recs = sqlx::query!(
        r#"SELECT r.node_id, r.name, r.value, r.reason, r.source, p.name AS "plugin?"
         FROM recommendations r
         LEFT JOIN plugins p ON p.id = r.plugin_id
         WHERE r.node_id = ANY($1) AND ($2::text[] IS NULL OR r.name = ANY($2))
         ORDER BY r.source, r.name"#,
        nodes,
        names as _,
    )
    .fetch_all(&mut *conn)
    .await?;
    let profiles = sqlx::query!(
        r#"SELECT n.id, p.name, p.env AS "env: sqlx::types::Json<BTreeMap<String, String>>",
                p.node_id IS NOT NULL AS "node_level!" FROM nodes n
             JOIN tuning_profiles p ON p.node_id = n.id OR p.site_id = n.site_id
             WHERE n.id = ANY($1)
             ORDER BY p.node_id IS NOT NULL, p.created_at, p.name"#,
        nodes,
    )
    .fetch_all(&mut *conn)
    .await?;
    let recs = recs
        .into_iter()
        .map(|r| (r.node_id, r.name, r.value, r.reason, r.source, r.plugin));
    let profiles = profiles
        .into_iter()
        .map(|p| (p.id, p.name, p.env, p.node_level));
    let mut recs_of: HashMap<Uuid, Vec<RecRow>> = HashMap::new();
    for r in recs {
        recs_of.entry(r.0).or_default().push(r);
    }
    let mut profiles_of: HashMap<Uuid, Vec<ProfileRow>> = HashMap::new();
    for p in profiles {
        profiles_of.entry(p.0).or_default().push(p);
    }
    let wanted = |name: &str| names.is_none_or(|n| n.contains(&name));
    Ok(nodes
        .iter()
        .map(|n| {
            let recs = recs_of.remove(n).unwrap_or_default();
            let profiles = profiles_of.remove(n).unwrap_or_default();
            (*n, resolve(candidates(recs, profiles, wanted)))
        })
        .collect())
}

/// A stored recommendation: node, name, value, reason, source, plugin name.
type RecRow = (Uuid, String, String, String, String, Option<String>);

/// The candidates of one node: its recommendation rows, then its tuning profiles' entries
/// whose name `keep` admits, each profile ranked by its place in `profiles`.
fn candidates(
    recs: Vec<RecRow>,
    profiles: Vec<ProfileRow>,
    keep: impl Fn(&str) -> bool,
) -> Vec<Candidate> {
    let mut candidates: Vec<Candidate> = recs
        .into_iter()
        .map(|(_, name, value, reason, source, plugin)| Candidate {
            rank: rank(&source, plugin.as_deref()),
            name,
            value,
            reason,
            source,
        })
        .collect();
    for (seq, (_, profile, env, node_level)) in profiles.into_iter().enumerate() {
        let scope = if node_level { "node" } else { "site" };
        for (name, value) in env.0 {
            if !keep(&name) {
                continue;
            }
            candidates.push(Candidate {
                name,
                value,
                reason: format!("chosen by {scope} tuning profile {profile:?}"),
                source: format!("tuning:{profile}"),
                rank: Rank::profile(node_level, seq as u64),
            });
        }
    }
    candidates
}

/// The environment a job on this node should run with: the winners of [`explain`].
pub async fn effective(
    conn: &mut PgConnection,
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

/// [`effective`] on a connection of the pool.
pub async fn effective_env(
    db: &sqlx::PgPool,
    node: Uuid,
) -> Result<Vec<Recommendation>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    effective(&mut conn, node).await
}

/// A stored row the env export refuses to write for a shell.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The node's own name cannot be written in the header comment.
    #[error(transparent)]
    Name(#[from] heddle_types::env_policy::EnvError),
    #[error(
        "the stored value of {name} from {origin:?} cannot be exported ({error}); replace that \
         source's recommendations (PUT /api/v1/nodes/{{node}}/recommendations) or delete the \
         tuning profile"
    )]
    Refused {
        name: String,
        origin: String,
        error: heddle_types::env_policy::EnvError,
    },
}

/// The export a job script sources: every word quoted, and nothing written that the policy
/// refuses. Stored rows are checked again here, so a row that predates the policy (or was
/// written around the API) fails the export loudly instead of reaching a shell.
pub fn render_export(node: &str, recs: &[Recommendation]) -> Result<String, ExportError> {
    use heddle_types::env_policy::{comment_line, export_line};
    let mut out = comment_line(&["Heddle", "environment", "for", "node", node])?;
    for r in recs {
        let mut words = Vec::with_capacity(3);
        if !r.reason.is_empty() {
            words.push(r.reason.as_str());
        }
        words.extend(["from", r.source.as_str()]);
        let lines = comment_line(&words).and_then(|c| Ok(c + &export_line(&r.name, &r.value)?));
        match lines {
            Ok(lines) => out.push_str(&lines),
            Err(error) => {
                tracing::warn!(node, name = %r.name, source = %r.source, %error, "stored recommendation refused by the env export");
                return Err(ExportError::Refused {
                    name: r.name.clone(),
                    origin: r.source.clone(),
                    error,
                });
            }
        }
    }
    Ok(out)
}

/// A row's place in the rule: a plugin's by the plugin's name, an operator's by its source.
fn rank(source: &str, plugin: Option<&str>) -> Rank {
    plugin.map_or_else(|| Rank::operator(source), Rank::plugin)
}

/// Replaces every recommendation of an operator's `set.source` on the node and its traits.
pub async fn replace_source(
    conn: &mut PgConnection,
    node: Uuid,
    set: &RecommendationSet,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM recommendations WHERE node_id = $1 AND source = $2",
        node,
        set.source,
    )
    .execute(&mut *conn)
    .await?;
    let (mut names, mut values, mut reasons) = (Vec::new(), Vec::new(), Vec::new());
    for item in dedup_by_name(set.items.iter().map(|i| (&i.name, &i.value, &i.reason))) {
        names.push(item.0.clone());
        values.push(item.1.clone());
        reasons.push(item.2.clone());
    }
    sqlx::query!(
        "INSERT INTO recommendations (node_id, source, name, value, reason)
         SELECT $1, $2, n, v, r FROM unnest($3::text[], $4::text[], $5::text[]) AS x(n, v, r)",
        node,
        set.source,
        &names,
        &values,
        &reasons,
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "DELETE FROM node_traits WHERE node_id = $1 AND source = $2",
        node,
        set.source,
    )
    .execute(&mut *conn)
    .await?;
    if !set.traits.is_empty() {
        sqlx::query!(
            "INSERT INTO node_traits (node_id, source, traits) VALUES ($1, $2, $3)",
            node,
            set.source,
            sqlx::types::Json(&set.traits) as _,
        )
        .execute(&mut *conn)
        .await?;
    }
    crate::db::job_env_version::mark_changed(
        conn,
        crate::db::job_env_version::Changed::Nodes(&[node]),
    )
    .await?;
    recompute_traits(conn, &[node]).await
}

/// Of several values for one name the last one counts, as a later line of an env file does.
fn dedup_by_name<'a>(
    items: impl Iterator<Item = (&'a String, &'a String, &'a String)>,
) -> Vec<(&'a String, &'a String, &'a String)> {
    let mut last: HashMap<&String, usize> = HashMap::new();
    let items: Vec<_> = items.collect();
    for (i, item) in items.iter().enumerate() {
        last.insert(item.0, i);
    }
    items
        .into_iter()
        .enumerate()
        .filter(|(i, item)| last[item.0] == *i)
        .map(|(_, item)| item)
        .collect()
}

/// What one plugin said about one node, to replace its earlier say.
pub struct PluginSay<'a> {
    pub node: Uuid,
    pub plugin: &'a Enabled,
    /// Empty when the plugin failed: it then recommends nothing and sets no trait.
    pub env: Vec<(&'a String, &'a String, &'a String)>,
    pub traits: BTreeMap<String, String>,
}

/// Replaces, in one statement per step, what plugins recommended for `nodes`: rows of
/// plugins not in `enabled` go, each of `says` replaces that plugin's rows on its node, and
/// the nodes' merged traits are recomputed.
pub async fn store_plugin_says(
    conn: &mut PgConnection,
    nodes: &[Uuid],
    enabled: &[Uuid],
    says: &[PluginSay<'_>],
) -> Result<(), sqlx::Error> {
    let said_nodes: Vec<Uuid> = says.iter().map(|s| s.node).collect();
    let said_plugins: Vec<Uuid> = says.iter().map(|s| s.plugin.plugin_id).collect();
    for table in ["recommendations", "node_traits"] {
        // Run time: one rule for both tables, named at run time
        // (plugins::plugins_turn_facts_into_recommendations).
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE node_id = ANY($1) AND plugin_id IS NOT NULL
               AND (NOT (plugin_id = ANY($2))
                    OR (node_id, plugin_id) IN (SELECT * FROM unnest($3::uuid[], $4::uuid[])))"
        ))
        .bind(nodes)
        .bind(enabled)
        .bind(&said_nodes)
        .bind(&said_plugins)
        .execute(&mut *conn)
        .await?;
    }
    let mut env = EnvColumns::default();
    let mut traits = TraitColumns::default();
    for say in says {
        let source = say.plugin.env_source();
        for (name, value, reason) in dedup_by_name(say.env.iter().copied()) {
            env.node.push(say.node);
            env.plugin.push(say.plugin.plugin_id);
            env.source.push(source.clone());
            env.name.push(name.clone());
            env.value.push(value.clone());
            env.reason.push(reason.clone());
        }
        if !say.traits.is_empty() {
            traits.node.push(say.node);
            traits.plugin.push(say.plugin.plugin_id);
            traits.source.push(say.plugin.traits_source());
            traits
                .traits
                .push(serde_json::to_string(&say.traits).unwrap_or_default());
        }
    }
    if !env.node.is_empty() {
        sqlx::query!(
            "INSERT INTO recommendations (node_id, plugin_id, source, name, value, reason)
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[])
             ON CONFLICT (node_id, source, name) DO UPDATE SET value = EXCLUDED.value,
                reason = EXCLUDED.reason, plugin_id = EXCLUDED.plugin_id",
            &env.node,
            &env.plugin,
            &env.source,
            &env.name,
            &env.value,
            &env.reason,
        )
        .execute(&mut *conn)
        .await?;
    }
    if !traits.node.is_empty() {
        sqlx::query!(
            "INSERT INTO node_traits (node_id, plugin_id, source, traits)
             SELECT n, p, s, t::jsonb FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[]) AS x(n, p, s, t)
             ON CONFLICT (node_id, source) DO UPDATE SET traits = EXCLUDED.traits,
                plugin_id = EXCLUDED.plugin_id",
            &traits.node,
            &traits.plugin,
            &traits.source,
            &traits.traits,
        )
        .execute(&mut *conn)
        .await?;
    }
    crate::db::job_env_version::mark_changed(
        conn,
        crate::db::job_env_version::Changed::Nodes(nodes),
    )
    .await?;
    recompute_traits(conn, nodes).await
}

#[derive(Default)]
struct EnvColumns {
    node: Vec<Uuid>,
    plugin: Vec<Uuid>,
    source: Vec<String>,
    name: Vec<String>,
    value: Vec<String>,
    reason: Vec<String>,
}

#[derive(Default)]
struct TraitColumns {
    node: Vec<Uuid>,
    plugin: Vec<Uuid>,
    source: Vec<String>,
    traits: Vec<String>,
}

/// `nodes.traits` is the merge of every source's traits by the rule of
/// `heddle_types::recommend` (`merge_traits`), as for env recommendations.
pub async fn recompute_traits(conn: &mut PgConnection, nodes: &[Uuid]) -> Result<(), sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT t.node_id, t.source, p.name AS "plugin?",
                t.traits AS "traits: sqlx::types::Json<BTreeMap<String, String>>"
             FROM node_traits t
             LEFT JOIN plugins p ON p.id = t.plugin_id WHERE t.node_id = ANY($1)
             ORDER BY t.node_id, t.source"#,
        nodes,
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut by_node: HashMap<Uuid, Vec<(Rank, &str, &BTreeMap<String, String>)>> = HashMap::new();
    for r in &rows {
        by_node.entry(r.node_id).or_default().push((
            rank(&r.source, r.plugin.as_deref()),
            &r.source,
            &r.traits.0,
        ));
    }
    let merged: Vec<String> = nodes
        .iter()
        .map(|n| {
            let traits = merge_traits(by_node.remove(n).unwrap_or_default());
            serde_json::to_string(&traits).unwrap_or_else(|_| "{}".into())
        })
        .collect();
    sqlx::query!(
        "UPDATE nodes SET traits = x.t::jsonb FROM unnest($1::uuid[], $2::text[]) AS x(id, t)
         WHERE nodes.id = x.id AND nodes.traits IS DISTINCT FROM x.t::jsonb",
        nodes,
        &merged,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, value: &str, reason: &str, source: &str) -> Recommendation {
        Recommendation {
            name: name.into(),
            value: value.into(),
            reason: reason.into(),
            source: source.into(),
        }
    }

    #[test]
    fn the_export_quotes_every_word() {
        let out = render_export(
            "gpu-1",
            &[
                rec("NCCL_IB_HCA", "mlx5_0:1", "", "plugin:a@1"),
                rec("NCCL_ALGO", "it's $(reboot)", "why; `id`", "tuning:x"),
            ],
        )
        .unwrap();
        assert!(
            out.starts_with("# Heddle environment for node gpu-1\n"),
            "{out}"
        );
        assert!(
            out.contains("# from plugin:a@1\nexport NCCL_IB_HCA=mlx5_0:1\n"),
            "{out}"
        );
        assert!(!out.contains("=it's"), "{out}");
    }

    #[test]
    fn a_stored_row_the_policy_refuses_fails_the_export() {
        for bad in [
            rec("LD_PRELOAD", "/x.so", "", "old"),
            rec("NCCL_ALGO", "Ring\ntouch /tmp/x", "", "old"),
            rec("NCCL_ALGO", "Ring", "a\nb", "old"),
            rec("NCCL_ALGO", "Ring", "", "old\ntouch /tmp/x"),
        ] {
            let err = render_export("n", &[bad]).unwrap_err();
            assert!(matches!(err, ExportError::Refused { .. }), "{err}");
        }
    }

    #[test]
    fn the_last_value_of_a_name_counts() {
        let s = |v: &str| v.to_string();
        let items = [
            (s("A"), s("1"), s("")),
            (s("B"), s("2"), s("")),
            (s("A"), s("3"), s("")),
        ];
        let kept = dedup_by_name(items.iter().map(|(n, v, r)| (n, v, r)));
        let kept: Vec<(&str, &str)> = kept
            .iter()
            .map(|(n, v, _)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(kept, [("B", "2"), ("A", "3")]);
    }
}
