//! Keeps what enabled plugins said about each node in step with its facts and the plugin set.
//! A loop on every replica claims nodes whose results are missing or stale (facts changed,
//! version changed, plugin disabled), evaluates them and writes their outcomes,
//! recommendations and traits.
//!
//! Replicas divide the work: a batch is claimed with a transaction-scoped advisory lock per
//! node (`pg_try_advisory_xact_lock`, skipping nodes another replica holds), re-checked as
//! still stale once locked, evaluated, and written in that same transaction, whose commit
//! releases the locks. So N replicas evaluate each stale node once, and a replica that dies
//! mid-batch leaves its nodes to the next claim.

use std::time::Duration;

use heddle_plugin_host::{FactsJson, HostError, LoadedPlugin, Report};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::AppState;
use crate::plugins::outcomes::{self, Enabled};
use crate::recommendations::{self, PluginSay};

/// Nodes claimed per batch: enough that Postgres sees few statements per node, few enough
/// that a batch of CPython calls holds its locks for a second or so.
const BATCH: i64 = 500;

/// First key of the reconciler's advisory locks (the second is the node's); distinct from
/// the other advisory locks the server takes (727274, 727275).
const LOCK_CLASS: i32 = 727_276;

/// Nodes whose plugin results are missing, stale or left over from a disabled plugin; only
/// those in `$1` when it is not NULL.
const STALE: &str = "
    (SELECT n.id FROM nodes n JOIN plugins p ON p.enabled AND p.active_version_id IS NOT NULL
      LEFT JOIN plugin_results r ON r.node_id = n.id AND r.plugin_id = p.id
      WHERE n.facts IS NOT NULL AND ($1::uuid[] IS NULL OR n.id = ANY($1))
        AND (r.node_id IS NULL OR r.version_id <> p.active_version_id OR r.facts_sha256 <> n.facts_sha256))
    UNION
    (SELECT r.node_id FROM plugin_results r JOIN plugins p ON p.id = r.plugin_id
      WHERE NOT p.enabled AND ($1::uuid[] IS NULL OR r.node_id = ANY($1)))
    UNION
    (SELECT t.node_id FROM node_traits t JOIN plugins p ON p.id = t.plugin_id
      WHERE NOT p.enabled AND ($1::uuid[] IS NULL OR t.node_id = ANY($1)))";

/// Locks up to `limit` stale nodes (not in `skip`) for this transaction, then keeps those
/// still stale: the first statement's snapshot predates the locks, so a node another
/// replica finished in between is dropped by the second. `None` when there was nothing to
/// lock.
async fn claim(
    conn: &mut PgConnection,
    skip: &[Uuid],
    limit: i64,
) -> Result<Option<Vec<Uuid>>, sqlx::Error> {
    let locked: Vec<(Uuid,)> = sqlx::query_as(&format!(
        "WITH stale AS MATERIALIZED ({STALE})
         SELECT id FROM stale
         WHERE CASE WHEN id = ANY($2) THEN false
                    ELSE pg_try_advisory_xact_lock({LOCK_CLASS}, hashtext(id::text)) END
         LIMIT $3"
    ))
    .bind(None::<Vec<Uuid>>)
    .bind(skip)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    if locked.is_empty() {
        return Ok(None);
    }
    let locked: Vec<Uuid> = locked.into_iter().map(|r| r.0).collect();
    let still: Vec<(Uuid,)> = sqlx::query_as(STALE)
        .bind(&locked)
        .fetch_all(&mut *conn)
        .await?;
    Ok(Some(still.into_iter().map(|r| r.0).collect()))
}

/// Evaluates a batch of nodes: facts and plugins read once, every call spread over the
/// cores, then every outcome written on `conn` in a few statements. A node's result is an
/// error when a plugin could not be run on it for a reason of the host's.
async fn evaluate_nodes(
    state: &AppState,
    conn: &mut PgConnection,
    nodes: &[Uuid],
) -> anyhow::Result<Vec<(Uuid, anyhow::Result<()>)>> {
    let rows: Vec<(Uuid, Option<Value>, Option<String>)> =
        sqlx::query_as("SELECT id, facts, facts_sha256 FROM nodes WHERE id = ANY($1)")
            .bind(nodes)
            .fetch_all(&mut *conn)
            .await?;
    let plugins = outcomes::enabled_plugins(&state.db).await?;
    let mut compiled = Vec::new();
    for p in &plugins {
        compiled.push(state.plugins.plugin(&state.db, &p.sha256).await?);
    }
    // Only plugins that compiled are run; the others' error is every node's outcome.
    let runnable: Vec<LoadedPlugin> = compiled
        .iter()
        .filter_map(|c| c.as_ref().ok().cloned())
        .collect();
    // (node, facts hash, whether it has facts to evaluate); the facts move into the batch.
    let mut subjects = Vec::with_capacity(rows.len());
    let mut facts = Vec::new();
    for (node, f, sha) in rows {
        let checked = match (f, &sha) {
            (Some(f), Some(_)) => FactsJson::from_value(f)
                .inspect_err(|e| tracing::warn!(%node, error = %e, "stored facts are not an object; skipping plugins"))
                .ok(),
            _ => None,
        };
        subjects.push((node, sha.unwrap_or_default(), checked.is_some()));
        facts.extend(checked);
    }
    let mut evaluated = state.plugins.evaluate(runnable, facts).await.into_iter();
    let mut batch = Vec::with_capacity(subjects.len());
    for (node, sha, has_facts) in subjects {
        let mut results = Vec::new();
        if has_facts {
            let mut ran = evaluated.next().unwrap_or_default().into_iter();
            for c in &compiled {
                results.push(match c {
                    Ok(_) => ran
                        .next()
                        .unwrap_or_else(|| Err(HostError::Internal("missing outcome".into()))),
                    Err(e) => Err(e.clone()),
                });
            }
        }
        batch.push((node, sha, results));
    }
    store(conn, &plugins, &batch).await
}

/// One node's results: (node, facts hash, one outcome per enabled plugin or none when the
/// node has no facts).
type Evaluated = (Uuid, String, Vec<Result<Report, HostError>>);

/// Replaces what the enabled plugins said about the batch's nodes. A host-side failure (the
/// host busy or broken, a compile that ran out of time on this machine) is no verdict on the
/// node: that plugin's previous result, recommendations and traits stay as they were, and
/// the node is reported as failed so the reconciler tries it again on a later tick.
async fn store(
    conn: &mut PgConnection,
    plugins: &[Enabled],
    batch: &[Evaluated],
) -> anyhow::Result<Vec<(Uuid, anyhow::Result<()>)>> {
    let nodes: Vec<Uuid> = batch.iter().map(|(n, _, _)| *n).collect();
    let enabled: Vec<Uuid> = plugins.iter().map(|p| p.plugin_id).collect();
    let mut rows = Vec::new();
    let mut says = Vec::new();
    let mut verdicts = Vec::with_capacity(batch.len());
    for (node, sha, results) in batch {
        let mut deferred = Vec::new();
        for (plugin, result) in plugins.iter().zip(results) {
            if let Err(e) = result
                && e.is_host_side()
            {
                deferred.push(format!("{}: {e}", plugin.name));
                continue;
            }
            rows.push(outcomes::Row {
                node: *node,
                plugin,
                facts_sha256: sha,
                result,
            });
            says.push(match result {
                Ok(r) => PluginSay {
                    node: *node,
                    plugin,
                    env: r
                        .detection
                        .env
                        .iter()
                        .map(|e| (&e.name, &e.value, &e.reason))
                        .collect(),
                    traits: r.detection.trait_map(),
                },
                Err(_) => PluginSay {
                    node: *node,
                    plugin,
                    env: Vec::new(),
                    traits: Default::default(),
                },
            });
        }
        verdicts.push((
            *node,
            if deferred.is_empty() {
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "host-side failure, nothing recorded: {}",
                    deferred.join("; ")
                ))
            },
        ));
    }
    outcomes::store(&mut *conn, &nodes, &enabled, &rows).await?;
    recommendations::store_plugin_says(&mut *conn, &nodes, &enabled, &says).await?;
    Ok(verdicts)
}

/// Claims and evaluates stale nodes until none is left for this replica; returns how many
/// it evaluated.
pub async fn reconcile(state: &AppState) -> anyhow::Result<usize> {
    let mut done = 0;
    let mut failed_here: Vec<Uuid> = Vec::new();
    loop {
        let mut tx = state.db.begin().await?;
        let Some(batch) = claim(&mut tx, &failed_here, BATCH).await? else {
            return Ok(done);
        };
        if batch.is_empty() {
            // Another replica finished them while this one was taking the locks.
            tx.commit().await?;
            continue;
        }
        let verdicts = evaluate_nodes(state, &mut tx, &batch).await?;
        tx.commit().await?;
        for (node, outcome) in verdicts {
            match outcome {
                Ok(()) => done += 1,
                Err(err) => {
                    tracing::warn!(%node, error = %err, "plugin evaluation failed; will retry on the next tick");
                    failed_here.push(node);
                }
            }
        }
    }
}

pub async fn run_reconciler(state: AppState) {
    loop {
        if let Err(err) = reconcile(&state).await {
            tracing::warn!(error = %format!("{err:#}"), "plugin reconciler failed; will retry");
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), state.plugins.wake.notified()).await;
    }
}
