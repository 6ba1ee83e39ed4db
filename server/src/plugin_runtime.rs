//! Runs enabled plugins on node facts and keeps their outputs, recommendations and traits in
//! step with the facts and the plugin set. A reconciler on every replica finds nodes whose
//! plugin results are missing or stale (facts changed, version changed, plugin disabled) and
//! re-evaluates them; its writes are idempotent, so replicas racing on a node converge.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use heddle_plugin_host::{
    ComponentInfo, FactsJson, HostConfig, HostError, Limits, LoadedPlugin, PluginHost, Report,
};
use heddle_types::plugins::OutputDiff;
use serde_json::Value;
use uuid::Uuid;

use crate::AppState;

/// The server's plugin engine: one wasmtime host (compile cache, epoch ticker) per replica.
pub struct PluginRuntime {
    host: Arc<PluginHost>,
    pub limits: Limits,
    /// Compiled plugins by sha256, so the node loop neither re-reads blobs from Postgres
    /// nor re-hashes their bytes on every call.
    loaded: Mutex<HashMap<String, LoadedPlugin>>,
    /// Wakes the reconciler early (facts changed, a plugin was enabled).
    pub wake: tokio::sync::Notify,
}

impl PluginRuntime {
    pub fn new(limits: Limits) -> anyhow::Result<Self> {
        Self::with_cache_dir(limits, None)
    }

    /// With `cache_dir`, compiled components are kept on local disk (see
    /// `heddle_plugin_host::HostConfig::cache_dir`), so a restart does not recompile them.
    pub fn with_cache_dir(
        limits: Limits,
        cache_dir: Option<std::path::PathBuf>,
    ) -> anyhow::Result<Self> {
        // Pre-allocated instance slots: a fresh store per call without mapping and unmapping a
        // linear memory each time. Two slots per core covers the evaluation threads plus API
        // calls (dry runs, uploads); beyond that a call waits for a slot to free up.
        let threads = eval_threads();
        let config = HostConfig {
            pooling_instances: Some(u32::try_from(threads * 2 + 8).unwrap_or(64)),
            pooling_max_memory_bytes: limits.max_memory_bytes.next_power_of_two(),
            cache_dir,
            ..HostConfig::default()
        };
        let host = PluginHost::new(config)
            .map_err(|e| anyhow::anyhow!("starting the plugin host: {e}"))?;
        Ok(PluginRuntime {
            host: Arc::new(host),
            limits,
            loaded: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Parses and checks an uploaded component (world, imports, size). CPU-bound, so it runs
    /// on the blocking pool.
    pub async fn validate(&self, bytes: Arc<Vec<u8>>) -> Result<ComponentInfo, HostError> {
        let host = self.host.clone();
        let limits = self.limits;
        tokio::task::spawn_blocking(move || host.validate(&bytes, &limits))
            .await
            .unwrap_or_else(|e| Err(HostError::Internal(format!("validation task failed: {e}"))))
    }

    /// Runs every plugin on every node's facts, spread over one thread per core; the outcome
    /// of node `i`, plugin `j` is `[i][j]`. One blocking task for the whole batch, so a call
    /// costs the plugin's own time and nothing for scheduling. Threads take nodes from a
    /// shared queue a few at a time (one slow node does not leave a core idle) and drop each
    /// node's facts as soon as its plugins ran, so freeing them is spread over the cores too.
    pub async fn evaluate(
        &self,
        plugins: Vec<LoadedPlugin>,
        facts: Vec<FactsJson>,
    ) -> Vec<Vec<Result<Report, HostError>>> {
        /// Nodes a thread takes per visit to the queue.
        const GRAB: usize = 16;
        let host = self.host.clone();
        let limits = self.limits;
        let nodes = facts.len();
        let result = tokio::task::spawn_blocking(move || {
            let queue = Mutex::new(facts.into_iter().enumerate());
            let work = || {
                let mut done = Vec::new();
                loop {
                    let grabbed: Vec<(usize, FactsJson)> = queue
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .by_ref()
                        .take(GRAB)
                        .collect();
                    if grabbed.is_empty() {
                        return done;
                    }
                    for (i, f) in grabbed {
                        done.push((
                            i,
                            plugins
                                .iter()
                                .map(|p| host.call(p, &f, &limits))
                                .collect::<Vec<_>>(),
                        ));
                    }
                }
            };
            let mut outcomes: Vec<Vec<Result<Report, HostError>>> = Vec::new();
            outcomes.resize_with(nodes, Vec::new);
            std::thread::scope(|scope| {
                let workers: Vec<_> = (0..eval_threads().min(nodes.div_ceil(GRAB)))
                    .filter_map(|n| {
                        std::thread::Builder::new()
                            .name(format!("heddle-plugins-{n}"))
                            .spawn_scoped(scope, work)
                            .ok()
                    })
                    .collect();
                // With no thread to be had, this one does the work.
                let mut done = if workers.is_empty() {
                    work()
                } else {
                    Vec::new()
                };
                done.extend(
                    workers
                        .into_iter()
                        .flat_map(|w| w.join().unwrap_or_default()),
                );
                for (i, r) in done {
                    outcomes[i] = r;
                }
            });
            outcomes
        })
        .await;
        match result {
            Ok(outcomes) if outcomes.len() == nodes => outcomes,
            Ok(_) | Err(_) => (0..nodes)
                .map(|_| {
                    vec![Err(HostError::Internal(
                        "plugin evaluation task failed".into(),
                    ))]
                })
                .collect(),
        }
    }

    /// Compiles and checks a component on the blocking pool.
    pub async fn load(&self, bytes: Vec<u8>) -> Result<LoadedPlugin, HostError> {
        let host = self.host.clone();
        let limits = self.limits;
        tokio::task::spawn_blocking(move || host.load(&bytes, &limits))
            .await
            .unwrap_or_else(|e| Err(HostError::Internal(format!("compile task failed: {e}"))))
    }

    /// The compiled plugin stored under `sha256`: from the cache, or read from Postgres and
    /// compiled. Bytes in Postgres were validated at upload, so a failure here is reported as
    /// the plugin's outcome on every node, not as a server error.
    pub async fn plugin(
        &self,
        db: &sqlx::PgPool,
        sha256: &str,
    ) -> Result<Result<LoadedPlugin, HostError>, sqlx::Error> {
        if let Some(p) = self.loaded.lock().unwrap().get(sha256) {
            return Ok(Ok(p.clone()));
        }
        let (bytes,): (Vec<u8>,) =
            sqlx::query_as("SELECT bytes FROM plugin_blobs WHERE sha256 = $1")
                .bind(sha256)
                .fetch_one(db)
                .await?;
        let loaded = self.load(bytes).await;
        if let Ok(p) = &loaded {
            let mut cache = self.loaded.lock().unwrap();
            if cache.len() >= 128 {
                cache.clear();
            }
            cache.insert(sha256.to_string(), p.clone());
        }
        Ok(loaded)
    }
}

/// Threads that evaluate plugins: one per core.
fn eval_threads() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
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

#[derive(sqlx::FromRow)]
struct Enabled {
    plugin_id: Uuid,
    name: String,
    version_id: Uuid,
    version: String,
    sha256: String,
}

async fn enabled_plugins(db: &sqlx::PgPool) -> Result<Vec<Enabled>, sqlx::Error> {
    sqlx::query_as(
        "SELECT p.id AS plugin_id, p.name, v.id AS version_id, v.version, v.sha256
         FROM plugins p JOIN plugin_versions v ON v.id = p.active_version_id WHERE p.enabled ORDER BY p.name",
    )
    .fetch_all(db)
    .await
}

/// Re-runs every enabled plugin on one node's latest facts and replaces what they said.
pub async fn evaluate_node(state: &AppState, node: Uuid) -> anyhow::Result<()> {
    evaluate_nodes(state, &[node])
        .await
        .into_iter()
        .next()
        .map_or(Ok(()), |(_, r)| r)
}

/// Evaluates a batch of nodes: facts and plugins read once, every call spread over the cores,
/// then each node's outcomes written in a transaction of its own.
async fn evaluate_nodes(state: &AppState, nodes: &[Uuid]) -> Vec<(Uuid, anyhow::Result<()>)> {
    let loaded = async {
        let rows: Vec<(Uuid, Option<Value>, Option<String>)> =
            sqlx::query_as("SELECT id, facts, facts_sha256 FROM nodes WHERE id = ANY($1)")
                .bind(nodes)
                .fetch_all(&state.db)
                .await?;
        let plugins = enabled_plugins(&state.db).await?;
        let mut compiled = Vec::new();
        for p in &plugins {
            compiled.push(state.plugins.plugin(&state.db, &p.sha256).await?);
        }
        anyhow::Ok((rows, plugins, compiled))
    };
    let (rows, plugins, compiled) = match loaded.await {
        Ok(v) => v,
        Err(e) => {
            let msg = format!("{e:#}");
            return nodes
                .iter()
                .map(|n| (*n, Err(anyhow::anyhow!("{msg}"))))
                .collect();
        }
    };
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
        subjects.push((node, sha, checked.is_some()));
        facts.extend(checked);
    }
    let mut evaluated = state.plugins.evaluate(runnable, facts).await.into_iter();
    let mut out = Vec::new();
    for (node, sha, has_facts) in subjects {
        let mut outcomes = Vec::new();
        if has_facts {
            let mut ran = evaluated.next().unwrap_or_default().into_iter();
            for c in &compiled {
                outcomes.push(match c {
                    Ok(_) => ran
                        .next()
                        .unwrap_or_else(|| Err(HostError::Internal("missing outcome".into()))),
                    Err(e) => Err(e.clone()),
                });
            }
        }
        out.push((
            node,
            store_outcomes(state, node, sha, &plugins, &outcomes).await,
        ));
    }
    out
}

/// Replaces what the enabled plugins said about `node` with `outcomes` (one per plugin, or
/// none when the node has no facts). A host-side failure (the host busy or broken, a compile
/// that ran out of time on this machine) is no verdict on the node: that plugin's previous
/// result, recommendations and traits stay as they were, and the node is reported as failed
/// so the reconciler tries it again on a later tick.
async fn store_outcomes(
    state: &AppState,
    node: Uuid,
    facts_sha: Option<String>,
    plugins: &[Enabled],
    outcomes: &[Result<Report, HostError>],
) -> anyhow::Result<()> {
    let facts_sha = facts_sha.unwrap_or_default();
    let names: Vec<String> = plugins.iter().map(|p| p.name.clone()).collect();
    let ids: Vec<Uuid> = plugins.iter().map(|p| p.plugin_id).collect();
    let mut tx = state.db.begin().await?;
    // Whatever plugins no longer enabled said about this node goes.
    sqlx::query("DELETE FROM plugin_results WHERE node_id = $1 AND NOT (plugin_id = ANY($2))")
        .bind(node)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    for table in ["recommendations", "node_traits"] {
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE node_id = $1 AND source LIKE 'plugin:%'
             AND NOT (split_part(substr(source, 8), '@', 1) = ANY($2))"
        ))
        .bind(node)
        .bind(&names)
        .execute(&mut *tx)
        .await?;
    }
    let mut deferred = Vec::new();
    for (p, result) in plugins.iter().zip(outcomes) {
        if let Err(e) = result
            && e.is_host_side()
        {
            deferred.push(format!("{}: {e}", p.name));
            continue;
        }
        let (output, error) = match result {
            Ok(r) => (Some(serde_json::to_value(&r.detection)?), None),
            Err(e) => (None, Some(format!("{e} [{}]", e.code()))),
        };
        sqlx::query(
            "INSERT INTO plugin_results (node_id, plugin_id, version_id, facts_sha256, output, error, usage, ran_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, now())
             ON CONFLICT (node_id, plugin_id) DO UPDATE SET version_id = EXCLUDED.version_id,
                facts_sha256 = EXCLUDED.facts_sha256, output = EXCLUDED.output, error = EXCLUDED.error,
                usage = EXCLUDED.usage, ran_at = now()",
        )
        .bind(node)
        .bind(p.plugin_id)
        .bind(p.version_id)
        .bind(&facts_sha)
        .bind(&output)
        .bind(&error)
        .bind(usage_json(result))
        .execute(&mut *tx)
        .await?;
        let source = format!("plugin:{}@{}", p.name, p.version);
        sqlx::query(
            "DELETE FROM recommendations WHERE node_id = $1 AND split_part(source, '@', 1) = $2",
        )
        .bind(node)
        .bind(format!("plugin:{}", p.name))
        .execute(&mut *tx)
        .await?;
        let traits: BTreeMap<String, String> = match result {
            Ok(r) => {
                for e in &r.detection.env {
                    sqlx::query(
                        "INSERT INTO recommendations (node_id, source, name, value, reason) VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (node_id, source, name) DO UPDATE SET value = EXCLUDED.value, reason = EXCLUDED.reason",
                    )
                    .bind(node)
                    .bind(&source)
                    .bind(&e.name)
                    .bind(&e.value)
                    .bind(&e.reason)
                    .execute(&mut *tx)
                    .await?;
                }
                r.detection.traits.iter().cloned().collect()
            }
            Err(_) => BTreeMap::new(),
        };
        set_traits(&mut tx, node, &format!("plugin:{}", p.name), &traits).await?;
    }
    recompute_traits(&mut tx, node).await?;
    tx.commit().await?;
    if !deferred.is_empty() {
        anyhow::bail!(
            "host-side failure, nothing recorded: {}",
            deferred.join("; ")
        );
    }
    Ok(())
}

/// Replaces one source's traits on a node (an empty map removes them).
pub async fn set_traits(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    node: Uuid,
    source: &str,
    traits: &BTreeMap<String, String>,
) -> Result<(), sqlx::Error> {
    if traits.is_empty() {
        sqlx::query("DELETE FROM node_traits WHERE node_id = $1 AND source = $2")
            .bind(node)
            .bind(source)
            .execute(&mut **tx)
            .await?;
    } else {
        sqlx::query(
            "INSERT INTO node_traits (node_id, source, traits) VALUES ($1, $2, $3)
             ON CONFLICT (node_id, source) DO UPDATE SET traits = EXCLUDED.traits",
        )
        .bind(node)
        .bind(source)
        .bind(sqlx::types::Json(traits))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// `nodes.traits` is the merge of every source's traits; on a conflict the source that
/// sorts last wins, as for env recommendations.
pub async fn recompute_traits(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    node: Uuid,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE nodes SET traits = coalesce((
            SELECT jsonb_object_agg(k, v) FROM (
                SELECT DISTINCT ON (e.key) e.key AS k, e.value AS v
                FROM node_traits t, jsonb_each(t.traits) e WHERE t.node_id = $1 ORDER BY e.key, t.source DESC) x), '{}'::jsonb)
         WHERE id = $1",
    )
    .bind(node)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Nodes whose plugin results are missing, stale or left over from a disabled plugin.
async fn stale_nodes(db: &sqlx::PgPool, limit: i64) -> Result<Vec<Uuid>, sqlx::Error> {
    let rows: Vec<(Uuid,)> = sqlx::query_as(
        "(SELECT n.id FROM nodes n JOIN plugins p ON p.enabled AND p.active_version_id IS NOT NULL
          LEFT JOIN plugin_results r ON r.node_id = n.id AND r.plugin_id = p.id
          WHERE n.facts IS NOT NULL
            AND (r.node_id IS NULL OR r.version_id <> p.active_version_id OR r.facts_sha256 <> n.facts_sha256))
         UNION
         (SELECT r.node_id FROM plugin_results r JOIN plugins p ON p.id = r.plugin_id WHERE NOT p.enabled)
         UNION
         (SELECT t.node_id FROM node_traits t WHERE t.source LIKE 'plugin:%' AND NOT EXISTS (
             SELECT 1 FROM plugins p WHERE p.enabled AND 'plugin:' || p.name = t.source))
         LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

/// Evaluates stale nodes until none is left; returns how many were evaluated.
pub async fn reconcile(state: &AppState) -> anyhow::Result<usize> {
    let mut done = 0;
    let mut failed_here: Vec<Uuid> = Vec::new();
    loop {
        let batch: Vec<Uuid> = stale_nodes(&state.db, 200)
            .await?
            .into_iter()
            .filter(|n| !failed_here.contains(n))
            .collect();
        if batch.is_empty() {
            return Ok(done);
        }
        for (node, outcome) in evaluate_nodes(state, &batch).await {
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
            tracing::warn!(error = %err, "plugin reconciler: database error; will retry");
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), state.plugins.wake.notified()).await;
    }
}

fn env_map(output: Option<&Value>) -> BTreeMap<String, String> {
    output
        .and_then(|o| o.get("env"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|e| {
                    Some((
                        e.get("name")?.as_str()?.to_string(),
                        e.get("value")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn trait_map(output: Option<&Value>) -> BTreeMap<String, String> {
    output
        .and_then(|o| o.get("traits"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|t| {
                    Some((
                        t.get(0)?.as_str()?.to_string(),
                        t.get(1)?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn warnings(output: Option<&Value>) -> Vec<String> {
    output
        .and_then(|o| o.get("warnings"))
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(|w| w.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn diff_maps(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    sep: &str,
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let added = new
        .iter()
        .filter(|(k, _)| !old.contains_key(*k))
        .map(|(k, v)| format!("{k}{sep}{v}"))
        .collect();
    let removed = old
        .iter()
        .filter(|(k, _)| !new.contains_key(*k))
        .map(|(k, v)| format!("{k}{sep}{v}"))
        .collect();
    let changed = new
        .iter()
        .filter_map(|(k, v)| {
            old.get(k)
                .filter(|o| *o != v)
                .map(|o| format!("{k}: {o} -> {v}"))
        })
        .collect();
    (added, removed, changed)
}

/// How a candidate output differs from the active one.
pub fn diff(active: Option<&Value>, candidate: Option<&Value>) -> OutputDiff {
    let (env_added, env_removed, env_changed) =
        diff_maps(&env_map(active), &env_map(candidate), "=");
    let (traits_added, traits_removed, traits_changed) =
        diff_maps(&trait_map(active), &trait_map(candidate), "=");
    let (old_w, new_w) = (warnings(active), warnings(candidate));
    OutputDiff {
        env_added,
        env_removed,
        env_changed,
        traits_added,
        traits_removed,
        traits_changed,
        warnings_added: new_w
            .iter()
            .filter(|w| !old_w.contains(w))
            .cloned()
            .collect(),
        warnings_removed: old_w
            .iter()
            .filter(|w| !new_w.contains(w))
            .cloned()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_names_what_changes() {
        let active = json!({"traits": [["cloud", "azure"], ["sku", "ND40rs_v2"]],
            "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": ""}, {"name": "OLD", "value": "1", "reason": ""}],
            "warnings": ["w1"]});
        let candidate = json!({"traits": [["cloud", "azure"], ["sku", "ND96asr_v4"]],
            "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_1", "reason": ""}, {"name": "NEW", "value": "2", "reason": ""}],
            "warnings": ["w2"]});
        let d = diff(Some(&active), Some(&candidate));
        assert_eq!(d.env_added, ["NEW=2"]);
        assert_eq!(d.env_removed, ["OLD=1"]);
        assert_eq!(d.env_changed, ["NCCL_IB_HCA: mlx5_0 -> mlx5_1"]);
        assert_eq!(d.traits_changed, ["sku: ND40rs_v2 -> ND96asr_v4"]);
        assert!(d.traits_added.is_empty() && d.traits_removed.is_empty());
        assert_eq!(
            (d.warnings_added.as_slice(), d.warnings_removed.as_slice()),
            (&["w2".to_string()][..], &["w1".to_string()][..])
        );
        assert_eq!(diff(Some(&active), Some(&active)), OutputDiff::default());
        assert_eq!(diff(None, Some(&active)).env_added.len(), 2);
    }
}
