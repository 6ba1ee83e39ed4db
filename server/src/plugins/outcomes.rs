//! The outcome store: what each enabled plugin said about each node (`plugin_results`). The
//! only module that writes that table, and where the API and the judging of results read
//! it (`/metrics` only counts its rows). Outputs are stored as the typed [`Detection`]
//! serialises and read back into it.

use heddle_plugin_host::{HostError, Report};
use heddle_types::plugins::{Detection, Expectation, PluginOutcome};
use serde_json::Value;
use uuid::Uuid;

pub use crate::db::plugins::Enabled;

pub async fn enabled_plugins(db: &sqlx::PgPool) -> Result<Vec<Enabled>, sqlx::Error> {
    sqlx::query_as!(
        Enabled,
        "SELECT p.id AS plugin_id, p.name, v.id AS version_id, v.version, v.sha256
         FROM plugins p JOIN plugin_versions v ON v.id = p.active_version_id
         WHERE p.enabled ORDER BY p.name",
    )
    .fetch_all(db)
    .await
}

/// Usage as JSON, from a report or from the error that stopped the plugin.
pub fn usage_json(result: &Result<Report, HostError>) -> Value {
    let usage = match result {
        Ok(r) => Some(&r.usage),
        Err(e) => e.usage(),
    };
    usage.map_or_else(
        || serde_json::json!({}),
        |u| serde_json::to_value(u).unwrap_or_default(),
    )
}

/// The error text an outcome records for a plugin's own failure.
pub fn error_text(e: &HostError) -> String {
    format!("{e} [{}]", e.code())
}

/// One plugin's verdict on one node, to be stored.
pub struct Row<'a> {
    pub node: Uuid,
    pub plugin: &'a Enabled,
    pub facts_sha256: &'a str,
    pub result: &'a Result<Report, HostError>,
}

/// Replaces, in one statement per table, what plugins said about `nodes`: outcomes of
/// plugins not in `enabled` go, and `rows` are written (at most one per node and plugin).
pub async fn store(
    conn: &mut sqlx::PgConnection,
    nodes: &[Uuid],
    enabled: &[Uuid],
    rows: &[Row<'_>],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM plugin_results WHERE node_id = ANY($1) AND NOT (plugin_id = ANY($2))",
        nodes,
        enabled,
    )
    .execute(&mut *conn)
    .await?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut cols = Columns::default();
    for r in rows {
        let (output, error) = match r.result {
            Ok(report) => (
                Some(serde_json::to_string(&report.detection).unwrap_or_default()),
                None,
            ),
            Err(e) => (None, Some(error_text(e))),
        };
        cols.node.push(r.node);
        cols.plugin.push(r.plugin.plugin_id);
        cols.version.push(r.plugin.version_id);
        cols.facts.push(r.facts_sha256.to_string());
        cols.output.push(output);
        cols.error.push(error);
        cols.usage.push(usage_json(r.result).to_string());
    }
    sqlx::query!(
        "INSERT INTO plugin_results (node_id, plugin_id, version_id, facts_sha256, output, error, usage, ran_at)
         SELECT n, p, v, f, o::jsonb, e, u::jsonb, now()
         FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::text[])
              AS x(n, p, v, f, o, e, u)
         ON CONFLICT (node_id, plugin_id) DO UPDATE SET version_id = EXCLUDED.version_id,
            facts_sha256 = EXCLUDED.facts_sha256, output = EXCLUDED.output, error = EXCLUDED.error,
            usage = EXCLUDED.usage, ran_at = now()",
        &cols.node,
        &cols.plugin,
        &cols.version,
        &cols.facts,
        &cols.output as &[Option<String>],
        &cols.error as &[Option<String>],
        &cols.usage,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[derive(Default)]
struct Columns {
    node: Vec<Uuid>,
    plugin: Vec<Uuid>,
    version: Vec<Uuid>,
    facts: Vec<String>,
    output: Vec<Option<String>>,
    error: Vec<Option<String>>,
    usage: Vec<String>,
}

/// What each plugin said about a node, with the resources it used, by plugin name.
pub async fn for_node(db: &sqlx::PgPool, node: Uuid) -> Result<Vec<PluginOutcome>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT r.node_id, n.hostname, p.name, v.version, r.output, r.error, r.usage, r.ran_at
         FROM plugin_results r JOIN nodes n ON n.id = r.node_id JOIN plugins p ON p.id = r.plugin_id
         JOIN plugin_versions v ON v.id = r.version_id WHERE r.node_id = $1 ORDER BY p.name",
        node,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| PluginOutcome {
            node_id: r.node_id,
            hostname: r.hostname,
            plugin: r.name,
            version: r.version,
            output: r.output.and_then(|o| decode(r.node_id, o)),
            error: r.error,
            usage: r.usage,
            ran_at: r.ran_at,
        })
        .collect())
}

/// A node a dry run evaluates: its facts and what the plugin's active version said.
pub struct DryRunSubject {
    pub node_id: Uuid,
    pub hostname: String,
    pub facts: Value,
    pub active: Option<Detection>,
    pub active_version: Option<String>,
}

/// Nodes with facts (all, or those in `nodes`), by hostname, with `plugin`'s stored output.
pub async fn dry_run_subjects(
    db: &sqlx::PgPool,
    plugin: Uuid,
    nodes: Option<&[Uuid]>,
    limit: i64,
) -> Result<Vec<DryRunSubject>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT n.id, n.hostname, n.facts AS "facts!", r.output AS "active?",
                v.version AS "active_version?"
             FROM nodes n
             LEFT JOIN plugin_results r ON r.node_id = n.id AND r.plugin_id = $1
             LEFT JOIN plugin_versions v ON v.id = r.version_id
             WHERE n.facts IS NOT NULL AND ($2::uuid[] IS NULL OR n.id = ANY($2))
             ORDER BY n.hostname LIMIT $3"#,
        plugin,
        nodes,
        limit,
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| DryRunSubject {
            node_id: r.id,
            hostname: r.hostname,
            facts: r.facts,
            active: r.active.and_then(|a| decode(r.id, a)),
            active_version: r.active_version,
        })
        .collect())
}

/// A stored output. Only the host writes them, in this shape; a row written around it that
/// does not fit is logged and shown as no output rather than failing the request.
fn decode(node: Uuid, output: Value) -> Option<Detection> {
    serde_json::from_value(output)
        .inspect_err(|e| tracing::warn!(%node, error = %e, "stored plugin output does not parse"))
        .ok()
}

/// The expectations this node's enabled plugins returned, with the plugin's name. Each
/// entry is decoded on its own, so one that does not parse costs only itself.
pub async fn expectations(
    db: &sqlx::PgPool,
    node: Uuid,
) -> Result<Vec<(String, Expectation)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT p.name, pr.output->'expectations' AS "expectations!"
         FROM plugin_results pr JOIN plugins p ON p.id = pr.plugin_id
         WHERE pr.node_id = $1 AND p.enabled AND jsonb_typeof(pr.output->'expectations') = 'array'
         ORDER BY p.name"#,
        node,
    )
    .fetch_all(db)
    .await?;
    Ok(decode_expectations(
        rows.into_iter().map(|r| (r.name, r.expectations)).collect(),
    ))
}

/// Each plugin's `expectations` array (by plugin name), decoded entry by entry.
pub fn decode_expectations(rows: Vec<(String, Value)>) -> Vec<(String, Expectation)> {
    let mut out = Vec::new();
    for (plugin, list) in rows {
        let Value::Array(list) = list else { continue };
        for entry in list {
            match serde_json::from_value::<Expectation>(entry) {
                Ok(e) => out.push((plugin.clone(), e)),
                Err(e) => {
                    tracing::debug!(%plugin, error = %e, "ignoring an expectation a plugin returned")
                }
            }
        }
    }
    out
}
