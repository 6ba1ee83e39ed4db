//! Keeps what enabled plugins said about each node in step with its facts and the plugin set.
//! A worker on every replica (`workers/plugin_reconciler.rs`) claims nodes whose results
//! are missing or stale (facts changed, version changed, plugin disabled), evaluates them
//! and writes their outcomes, recommendations and traits.
//!
//! Replicas divide the work: a batch is claimed with a transaction-scoped advisory lock per
//! node (`pg_try_advisory_xact_lock`, skipping nodes another replica holds), re-checked as
//! still stale once locked, evaluated, and written in that same transaction, whose commit
//! releases the locks. So N replicas evaluate each stale node once, and a replica that dies
//! mid-batch leaves its nodes to the next claim.
//!
//! Candidates are the nodes SQL's `is_plugins_due` (migration `plugins_due`) finds: nodes whose
//! facts hash changed since they were evaluated (`nodes.plugins_due`, set by a trigger) and
//! nodes evaluated against an older plugin set (`nodes.plugins_seen` behind
//! `plugin_set.mark`, which every change to the plugin set moves on in its own
//! transaction), both read through an index: finding them no longer compares every node
//! with every plugin. Due is only a hint. [`STALE_RULE`] decides, for the nodes claimed.
//! A batch settles a node in its own transaction, only while the node's facts hash is
//! still the one evaluated, and with the mark it read before it read the plugins: a plugin
//! changed while the batch ran leaves the node due. Every [`SWEEP_EVERY`] the full rule
//! flags any stale node that nothing marked due.

use std::time::Duration;

use heddle_plugin_host::{FactsJson, HostError, LoadedPlugin, Report};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::job_env::JobEnvSeen;
use crate::plugins::PluginRuntime;
use crate::plugins::outcomes::{self, Enabled};
use crate::recommendations::{self, PluginSay};

/// Nodes claimed per batch: enough that Postgres sees few statements per node, few enough
/// that a batch of CPython calls holds its locks for a second or so.
const BATCH: i64 = 500;

/// First key of the reconciler's advisory locks (the second is the node's); distinct from
/// the other advisory locks the server takes (727274, 727275).
const LOCK_CLASS: i32 = 727_276;

/// How often a replica runs the full staleness rule over every node, to flag what the
/// triggers missed (facts or results written by a path the triggers do not watch).
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The rule: nodes whose plugin results are missing, stale or left over from a disabled
/// plugin, among the nodes whose id satisfies `{in}`.
const STALE_RULE: &str = "
    (SELECT n.id FROM nodes n JOIN plugins p ON p.enabled AND p.active_version_id IS NOT NULL
      LEFT JOIN plugin_results r ON r.node_id = n.id AND r.plugin_id = p.id
      WHERE n.facts IS NOT NULL AND n.id {in}
        AND (r.node_id IS NULL OR r.version_id <> p.active_version_id OR r.facts_sha256 <> n.facts_sha256))
    UNION
    (SELECT r.node_id FROM plugin_results r JOIN plugins p ON p.id = r.plugin_id
      WHERE NOT p.enabled AND r.node_id {in})
    UNION
    (SELECT t.node_id FROM node_traits t JOIN plugins p ON p.id = t.plugin_id
      WHERE NOT p.enabled AND t.node_id {in})";

/// [`STALE_RULE`] over the nodes in `$1`, or over every node. Two statements rather than
/// one with `$1 IS NULL OR ...`: a prepared statement's generic plan for that form cannot
/// use the primary keys, and scanned every node for each batch of 500.
fn stale(among: Among) -> String {
    STALE_RULE.replace(
        "{in}",
        match among {
            Among::Listed => "= ANY($1)",
            Among::All => "IS NOT NULL",
        },
    )
}

/// Which nodes [`stale`] looks at.
enum Among {
    /// Those in `$1`.
    Listed,
    All,
}

/// A claimed batch: the plugin set's mark when it was claimed, the nodes still stale, to
/// evaluate, and the others with the facts hash they had when found not stale, which can
/// be settled.
struct Claimed {
    mark: i64,
    stale: Vec<Uuid>,
    settled: Vec<(Uuid, Option<String>)>,
}

/// Reads the plugin set's mark, locks up to `limit` nodes due by it (not in `skip`) for
/// this transaction, then sorts them by the exact rule: the locking statement's snapshot
/// predates the locks, so a node another replica finished in between is found not stale
/// by the rule. The mark is read before anything else, so a plugin change it does not
/// include leaves what this batch settles due. `None` when there was nothing to lock.
async fn claim(
    conn: &mut PgConnection,
    skip: &[Uuid],
    limit: i64,
) -> Result<Option<Claimed>, sqlx::Error> {
    let mark = sqlx::query_scalar!("SELECT mark FROM plugin_set")
        .fetch_one(&mut *conn)
        .await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT id FROM nodes
         WHERE is_plugins_due(plugins_due, plugins_seen, $3)
           AND CASE WHEN id = ANY($1) THEN false
                    ELSE pg_try_advisory_xact_lock($4, hashtext(id::text)) END
         LIMIT $2"#,
        skip,
        limit,
        mark,
        LOCK_CLASS,
    )
    .fetch_all(&mut *conn)
    .await?;
    if locked.is_empty() {
        return Ok(None);
    }
    // Hashes first, then the rule: facts that change in between make the node stale by
    // the rule, so a hash read here is never newer than the rule's verdict on it.
    let hashes: Vec<(Uuid, Option<String>)> = sqlx::query!(
        "SELECT id, facts_sha256 FROM nodes WHERE id = ANY($1)",
        &locked
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.id, r.facts_sha256))
    .collect();
    // Run time: the staleness rule is shared with `sweep`
    // (plugin_replicas::nodes_due_are_flagged_evaluated_and_swept_when_the_flag_is_missed).
    let stale: Vec<Uuid> = sqlx::query_as::<_, (Uuid,)>(&stale(Among::Listed))
        .bind(&locked)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|r| r.0)
        .collect();
    let settled = hashes
        .into_iter()
        .filter(|(id, _)| !stale.contains(id))
        .collect();
    Ok(Some(Claimed {
        mark,
        stale,
        settled,
    }))
}

/// Marks `nodes` whose facts hash is still the one given as evaluated against the plugin
/// set of `mark`, in the batch's transaction. A node whose facts changed since stays due,
/// and so does every node once the plugin set has moved past `mark`.
async fn settle(
    conn: &mut PgConnection,
    mark: i64,
    nodes: &[(Uuid, Option<String>)],
) -> Result<(), sqlx::Error> {
    if nodes.is_empty() {
        return Ok(());
    }
    let (ids, hashes): (Vec<Uuid>, Vec<Option<String>>) = nodes.iter().cloned().unzip();
    sqlx::query!(
        "UPDATE nodes n SET plugins_due = false, plugins_seen = greatest(n.plugins_seen, $3)
         FROM unnest($1::uuid[], $2::text[]) AS s(id, sha)
         WHERE n.id = s.id AND n.facts_sha256 IS NOT DISTINCT FROM s.sha
           AND (n.plugins_due OR n.plugins_seen < $3)",
        &ids,
        &hashes as &[Option<String>],
        mark,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Flags every node the full rule finds stale that is not due; returns how many.
pub async fn sweep(db: &sqlx::PgPool) -> Result<u64, sqlx::Error> {
    // Run time: the staleness rule is shared with `claim`
    // (plugin_replicas::nodes_due_are_flagged_evaluated_and_swept_when_the_flag_is_missed).
    let flagged = sqlx::query(&format!(
        "UPDATE nodes SET plugins_due = true
         WHERE id IN ({}) AND id NOT IN (SELECT id FROM plugins_due_nodes)",
        stale(Among::All)
    ))
    .execute(db)
    .await?
    .rows_affected();
    if flagged > 0 {
        tracing::warn!(
            nodes = flagged,
            "plugin results were stale on nodes not flagged as due; flagged them"
        );
    }
    Ok(flagged)
}

/// Evaluates a batch of nodes: facts and plugins read once, every call spread over the
/// cores, then every outcome written on `conn` in a few statements. A node's result is an
/// error when a plugin could not be run on it for a reason of the host's.
async fn evaluate_nodes(
    db: &sqlx::PgPool,
    runtime: &PluginRuntime,
    conn: &mut PgConnection,
    mark: i64,
    nodes: &[Uuid],
) -> anyhow::Result<Vec<(Uuid, anyhow::Result<()>)>> {
    let rows: Vec<(Uuid, Option<Value>, Option<String>)> = sqlx::query!(
        "SELECT id, facts, facts_sha256 FROM nodes WHERE id = ANY($1)",
        nodes
    )
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| (r.id, r.facts, r.facts_sha256))
    .collect();
    let seen: Vec<(Uuid, Option<String>)> =
        rows.iter().map(|(id, _, sha)| (*id, sha.clone())).collect();
    let plugins = outcomes::enabled_plugins(db).await?;
    let mut compiled = Vec::new();
    for p in &plugins {
        compiled.push(runtime.plugin(db, &p.sha256).await?);
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
    let mut evaluated = runtime.evaluate(runnable, facts).await.into_iter();
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
    let verdicts = store(conn, &plugins, &batch).await?;
    // A node with a host-side failure stays due, for the next tick.
    // `store` answers for the nodes in the order they were read.
    let done: Vec<(Uuid, Option<String>)> = seen
        .into_iter()
        .zip(&verdicts)
        .filter(|((id, _), (node, v))| id == node && v.is_ok())
        .map(|(seen, _)| seen)
        .collect();
    settle(conn, mark, &done).await?;
    Ok(verdicts)
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
/// it evaluated. The job environments of the nodes it evaluated are forgotten from
/// `job_env_seen`; `hold` keeps each claimed batch locked that long first (tests).
pub async fn reconcile(
    db: &sqlx::PgPool,
    runtime: &PluginRuntime,
    job_env_seen: &JobEnvSeen,
    hold: Duration,
) -> anyhow::Result<usize> {
    let mut done = 0;
    let mut failed_here: Vec<Uuid> = Vec::new();
    loop {
        let mut tx = db.begin().await?;
        let Some(Claimed {
            mark,
            stale,
            settled,
        }) = claim(&mut tx, &failed_here, BATCH).await?
        else {
            return Ok(done);
        };
        // Nodes another replica finished while this one was taking the locks, or made due
        // by a change that left their results as they were.
        settle(&mut tx, mark, &settled).await?;
        if stale.is_empty() {
            tx.commit().await?;
            continue;
        }
        if !hold.is_zero() {
            tracing::info!(
                nodes = stale.len(),
                hold_ms = hold.as_millis() as u64,
                "plugin reconciler holding a claimed batch (HEDDLE_RECONCILER_HOLD_MS)"
            );
            tokio::time::sleep(hold).await;
        }
        let verdicts = evaluate_nodes(db, runtime, &mut tx, mark, &stale).await?;
        tx.commit().await?;
        job_env_seen.forget(&stale);
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
