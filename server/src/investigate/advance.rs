//! What the investigations worker every replica runs (`workers/investigations.rs`) does:
//! start investigations for runs with warn or fail verdicts, record the figures of finished
//! pair runs, start the next batch, finish.
//! One investigation is advanced inside one transaction holding its row lock (taken with
//! `SKIP LOCKED`), so a batch is started once however many replicas tick at the same time.

use std::time::Duration;

use heddle_types::investigations::{DEFAULT_THRESHOLD, InvestigationCreate, InvestigationKind};
use heddle_types::jobs::JobSpec;
use uuid::Uuid;

use super::store::{self, InvRow, NewInvestigation};
use super::{AUTO_ACTOR, InvestigateError, MAX_NODES, THRESHOLDS};
use crate::jobs::{self, JobError, NewRun};

/// Attempts of a pair's jobs, as for a run started without `max_attempts`.
const PAIR_MAX_ATTEMPTS: u32 = 3;
/// A pair job nobody claims for this long (its node's agent is down or busy elsewhere) gives
/// up its run, so the investigation ends with that pair failed instead of waiting forever.
pub const PAIR_CLAIM_DEADLINE: Duration = Duration::from_secs(600);

/// Checks a request, stores the investigation and starts its first batch, in one
/// transaction with its audit entries.
pub async fn create(
    db: &sqlx::PgPool,
    actor: &str,
    req: &InvestigationCreate,
) -> Result<Uuid, InvestigateError> {
    if let Some(label) = &req.label {
        heddle_types::names::check_label("the investigation's label", label)
            .map_err(InvestigateError::Invalid)?;
    }
    if req.nodes.len() < 2 || req.nodes.len() > MAX_NODES {
        return Err(InvestigateError::Invalid(format!(
            "nodes must list 2 to {MAX_NODES} nodes"
        )));
    }
    let threshold = req.threshold.unwrap_or(DEFAULT_THRESHOLD);
    if !THRESHOLDS.contains(&threshold) {
        return Err(InvestigateError::Invalid(format!(
            "threshold must be between {} and {}",
            THRESHOLDS.start(),
            THRESHOLDS.end()
        )));
    }
    let batch_size = i32::try_from(req.batch_size)
        .ok()
        .filter(|k| *k <= 4096)
        .ok_or_else(|| InvestigateError::Invalid("batch_size must be between 0 and 4096".into()))?;
    let mut spec = JobSpec {
        env: req.env.clone(),
        timeout_s: req.timeout_s,
        ..JobSpec::new(req.kind.as_str(), req.params.clone())
    };
    jobs::validate_spec(&mut spec)?;
    let mut tx = db.begin().await?;
    let node_ids = jobs::resolve_run_nodes(&mut tx, &req.nodes).await?;
    // Every pair is run, so any two nodes that disagree on a must-agree variable would
    // make a pair that hangs: refuse the investigation as a run would be refused.
    jobs::agreed_env(&mut tx, &spec, &node_ids, true).await?;
    let new = NewInvestigation {
        spec,
        node_ids,
        batch_size,
        threshold,
        label: req.label.clone(),
        trigger_run_id: None,
        actor,
    };
    let id = store::insert(&mut tx, &new)
        .await?
        .expect("no trigger run, so no conflict");
    advance_locked(&mut tx, id).await?;
    tx.commit().await?;
    tracing::info!(investigation = %id, kind = %req.kind.as_str(), nodes = req.nodes.len(), "investigation started");
    Ok(id)
}

/// Advances every running investigation that no other replica holds right now. Returns
/// how many pair runs were started.
pub async fn advance_all(db: &sqlx::PgPool) -> Result<usize, InvestigateError> {
    let ids = sqlx::query_scalar!(
        "SELECT id FROM investigations WHERE state = 'running' ORDER BY created_at"
    )
    .fetch_all(db)
    .await?;
    let mut started = 0;
    for id in ids {
        let mut tx = db.begin().await?;
        started += advance_locked(&mut tx, id).await?;
        tx.commit().await?;
    }
    Ok(started)
}

/// Locks the investigation (skipping it when another transaction holds it), records
/// finished pairs, then starts the next batch or finishes. Returns the runs started.
pub(super) async fn advance_locked(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: Uuid,
) -> Result<usize, InvestigateError> {
    let Some(inv) = store::lock_running(tx, id).await? else {
        return Ok(0);
    };
    let Ok(kind) = inv.kind() else {
        fail(tx, id, "its kind is unknown to this server").await?;
        return Ok(0);
    };
    give_up_unclaimed(tx, id).await?;
    collect(tx, id, kind).await?;
    let counts = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE state = 'pending') AS "pending!",
                count(*) FILTER (WHERE state = 'running') AS "running!"
         FROM investigation_pairs WHERE investigation_id = $1"#,
        id,
    )
    .fetch_one(&mut **tx)
    .await?;
    if counts.running > 0 {
        return Ok(0);
    }
    if counts.pending > 0 {
        return start_batch(tx, &inv).await;
    }
    let done = sqlx::query_scalar!(
        r#"SELECT count(*) AS "done!" FROM investigation_pairs
         WHERE investigation_id = $1 AND state = 'done'"#,
        id,
    )
    .fetch_one(&mut **tx)
    .await?;
    if done == 0 {
        fail(tx, id, "no pair produced a figure").await?;
    } else {
        sqlx::query!(
            "UPDATE investigations SET state = 'done', finished_at = now() WHERE id = $1",
            id
        )
        .execute(&mut **tx)
        .await?;
        tracing::info!(investigation = %id, pairs_measured = done, "investigation done");
    }
    Ok(0)
}

async fn fail(tx: &mut sqlx::PgConnection, id: Uuid, why: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE investigation_pairs SET state = 'failed', error = $2
         WHERE investigation_id = $1 AND state = 'pending'",
        id,
        format!("not run: {why}"),
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE investigations SET state = 'failed', error = $2, finished_at = now() WHERE id = $1",
        id,
        why,
    )
    .execute(&mut *tx)
    .await?;
    tracing::warn!(investigation = %id, why, "investigation failed");
    Ok(())
}

/// Starts the pending pairs of the lowest pending batch, or every pending pair when the
/// batch size is 0. Jobs of later batches are placed later in the claim order, so each node
/// works through its pairs round by round and a pair's two jobs meet.
async fn start_batch(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    inv: &InvRow,
) -> Result<usize, InvestigateError> {
    let names = sqlx::query!(
        "SELECT id, hostname FROM nodes WHERE id = ANY($1)",
        &inv.node_ids
    )
    .fetch_all(&mut **tx)
    .await?;
    let host = |id: &Uuid| {
        names
            .iter()
            .find(|n| n.id == *id)
            .map(|n| n.hostname.clone())
    };
    if let Some(gone) = inv.node_ids.iter().find(|id| host(id).is_none()) {
        fail(tx, inv.id, &format!("node {gone} no longer exists")).await?;
        return Ok(0);
    }
    let pairs: Vec<(i32, i32, i32)> = sqlx::query!(
        "SELECT a, b, batch FROM investigation_pairs
         WHERE investigation_id = $1 AND state = 'pending'
           AND ($2 OR batch = (SELECT min(batch) FROM investigation_pairs WHERE investigation_id = $1 AND state = 'pending'))
         ORDER BY batch, a, b",
        inv.id,
        inv.batch_size == 0,
    )
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|p| (p.a, p.b, p.batch))
    .collect();
    let spec: JobSpec = inv.spec();
    for &(a, b, batch) in &pairs {
        let nodes = [inv.node_ids[a as usize], inv.node_ids[b as usize]];
        let (ha, hb) = (
            host(&nodes[0]).unwrap_or_default(),
            host(&nodes[1]).unwrap_or_default(),
        );
        let label = format!("investigation {}: {ha}–{hb}", inv.id);
        let started = jobs::insert_run(
            tx,
            &NewRun {
                spec: &spec,
                nodes: &nodes,
                max_attempts: PAIR_MAX_ATTEMPTS,
                label: Some(&label),
                actor: &inv.created_by,
                recommended_env: true,
                audit: serde_json::json!({"nodes": [ha, hb], "investigation": inv.id}),
            },
        )
        .await;
        let run_id = match started {
            Ok(id) => id,
            // The pair's environments came to disagree after the investigation started (a
            // tuning profile kept since): the pair fails with the reason instead of hanging.
            Err(JobError::EnvSplit(splits)) => {
                tracing::warn!(investigation = %inv.id, %splits, "pair not started");
                sqlx::query!(
                    "UPDATE investigation_pairs SET state = 'failed', error = $4
                     WHERE investigation_id = $1 AND a = $2 AND b = $3",
                    inv.id,
                    a,
                    b,
                    splits.to_string(),
                )
                .execute(&mut **tx)
                .await?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        jobs::store::reorder(tx, run_id, f64::from(batch)).await?;
        sqlx::query!(
            "UPDATE investigation_pairs SET state = 'running', run_id = $4
             WHERE investigation_id = $1 AND a = $2 AND b = $3",
            inv.id,
            a,
            b,
            run_id,
        )
        .execute(&mut **tx)
        .await?;
    }
    if !pairs.is_empty() {
        tracing::info!(investigation = %inv.id, runs = pairs.len(), batch = pairs[0].2, "investigation: pair runs started");
    }
    Ok(pairs.len())
}

struct Ended {
    a: i32,
    b: i32,
    run_id: Option<Uuid>,
    jobs: i64,
    ended: i64,
    ok: i64,
    why: Option<String>,
}

/// Cancels the runs of running pairs that have a job unclaimed past [`PAIR_CLAIM_DEADLINE`]:
/// the unclaimed job ends `cancelled` with the reason, its peer is asked to stop, and
/// `collect` then records the pair as failed, naming the node.
async fn give_up_unclaimed(tx: &mut sqlx::PgConnection, id: Uuid) -> Result<(), JobError> {
    let deadline = PAIR_CLAIM_DEADLINE.as_secs() as i64;
    let runs = jobs::store::give_up_unclaimed(tx, id, deadline).await?;
    if !runs.is_empty() {
        tracing::warn!(investigation = %id, runs = runs.len(), "pair jobs unclaimed past the deadline; their runs are cancelled");
    }
    Ok(())
}

/// Records the figure (or the failure) of every running pair whose run has ended.
async fn collect(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    kind: InvestigationKind,
) -> Result<(), sqlx::Error> {
    let ended = sqlx::query_as!(
        Ended,
        r#"SELECT p.a, p.b, p.run_id, count(j.id) AS "jobs!",
                count(j.id) FILTER (WHERE j.state IN ('succeeded', 'failed', 'cancelled', 'skipped')) AS "ended!",
                count(j.id) FILTER (WHERE j.state = 'succeeded') AS "ok!",
                string_agg(format('%s %s: %s', n.hostname, j.state, coalesce(r.reason, j.error, 'no reason given')), '; ' ORDER BY j.rank)
                    FILTER (WHERE j.state <> 'succeeded') AS why
         FROM investigation_pairs p
         LEFT JOIN jobs j ON j.run_id = p.run_id
         LEFT JOIN nodes n ON n.id = j.node_id
         LEFT JOIN results r ON r.job_id = j.id
         WHERE p.investigation_id = $1 AND p.state = 'running'
         GROUP BY p.a, p.b, p.run_id"#,
        id,
    )
    .fetch_all(&mut *tx)
    .await?;
    let finished: Vec<&Ended> = ended
        .iter()
        .filter(|e| e.jobs == 0 || e.ended == e.jobs)
        .collect();
    let ok_runs: Vec<Uuid> = finished
        .iter()
        .filter(|e| e.jobs > 0 && e.ok == e.jobs)
        .filter_map(|e| e.run_id)
        .collect();
    // Run time: the metric column is chosen by kind
    // (investigations::started_by_hand_it_names_the_degraded_node).
    let rows: Vec<(Uuid, i64, Option<f64>)> = sqlx::query_as(&format!(
        "SELECT j.run_id, rr.size_bytes, rr.{} FROM result_rows rr
         JOIN results r ON r.id = rr.result_id JOIN jobs j ON j.id = r.job_id WHERE j.run_id = ANY($1)",
        kind.metric()
    ))
    .bind(&ok_runs)
    .fetch_all(&mut *tx)
    .await?;
    for e in finished {
        let (value, error) = match run_figure(
            e.jobs,
            e.ok,
            e.why.as_deref(),
            e.run_id,
            &rows,
            kind.metric(),
        ) {
            Ok(v) => (Some(v), None),
            Err(why) => (None, Some(why)),
        };
        sqlx::query!(
            "UPDATE investigation_pairs SET state = CASE WHEN $4::float8 IS NULL THEN 'failed' ELSE 'done' END,
                    value = $4, size_bytes = $5, error = $6
             WHERE investigation_id = $1 AND a = $2 AND b = $3",
            id,
            e.a,
            e.b,
            value.map(|v| v.1),
            value.map(|v| v.0),
            error,
        )
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// The figure of a finished run (`jobs` of which `ok` succeeded, `why` the others'
/// reasons) from `rows` (run, size, `metric`) of the finished runs: its [`headline`], or why
/// it has none. Pairs and fabric tests are judged alike.
pub(super) fn run_figure(
    jobs: i64,
    ok: i64,
    why: Option<&str>,
    run_id: Option<Uuid>,
    rows: &[(Uuid, i64, Option<f64>)],
    metric: &str,
) -> Result<(i64, f64), String> {
    if jobs == 0 {
        return Err("its run was deleted".into());
    }
    if ok < jobs {
        return Err(why.unwrap_or("its run did not succeed").to_string());
    }
    let mine: Vec<(i64, Option<f64>)> = rows
        .iter()
        .filter(|r| Some(r.0) == run_id)
        .map(|r| (r.1, r.2))
        .collect();
    headline(&mine).ok_or_else(|| format!("its results have no {metric}"))
}

/// The pair's figure: the mean, over both ranks' rows (and nccl-tests' out-of-place and
/// in-place rows), of the metric at the largest size that has it.
pub(super) fn headline(rows: &[(i64, Option<f64>)]) -> Option<(i64, f64)> {
    let with: Vec<(i64, f64)> = rows
        .iter()
        .filter_map(|&(s, v)| Some((s, v.filter(|v| v.is_finite())?)))
        .collect();
    let size = with.iter().map(|w| w.0).max()?;
    let at: Vec<f64> = with.iter().filter(|w| w.0 == size).map(|w| w.1).collect();
    Some((size, at.iter().sum::<f64>() / at.len() as f64))
}

struct Suspect {
    id: Uuid,
    spec: sqlx::types::Json<JobSpec>,
    node_ids: Vec<Uuid>,
}

/// Starts an investigation for every finished multi-node nccl or rdma run with a warn or
/// fail verdict (judged in the last day) that has none yet, using the run's own params.
/// Runs started by investigations, pairwise or fabric, are never investigated themselves.
/// Returns how many were started.
pub async fn trigger_from_verdicts(db: &sqlx::PgPool) -> Result<usize, InvestigateError> {
    let suspects = sqlx::query_as!(
        Suspect,
        r#"SELECT r.id, r.spec AS "spec: sqlx::types::Json<JobSpec>",
                array_agg(j.node_id ORDER BY j.rank) AS "node_ids!"
         FROM runs r JOIN jobs j ON j.run_id = r.id
         WHERE r.id IN (SELECT v.run_id FROM verdicts v
                        WHERE v.verdict IN ('warn', 'fail') AND v.judged_at > now() - interval '1 day')
           AND r.spec->>'kind' IN ('nccl', 'rdma')
           AND NOT EXISTS (SELECT 1 FROM investigations i WHERE i.trigger_run_id = r.id)
           AND NOT EXISTS (SELECT 1 FROM investigation_pairs p WHERE p.run_id = r.id)
           AND NOT EXISTS (SELECT 1 FROM fabric_tests f WHERE f.run_id = r.id)
         GROUP BY r.id, r.spec
         HAVING count(*) BETWEEN 2 AND $1
            AND bool_and(j.state IN ('succeeded', 'failed', 'cancelled', 'skipped'))
         ORDER BY min(r.created_at) LIMIT 16"#,
        MAX_NODES as i64,
    )
    .fetch_all(db)
    .await?;
    let mut started = 0;
    for s in suspects {
        let mut tx = db.begin().await?;
        let new = NewInvestigation {
            spec: s.spec.0,
            node_ids: s.node_ids,
            batch_size: 0,
            threshold: DEFAULT_THRESHOLD,
            label: Some(format!("run {} had a warn or fail verdict", s.id)),
            trigger_run_id: Some(s.id),
            actor: AUTO_ACTOR,
        };
        // Another replica may have started it a moment ago: the unique trigger says so.
        if let Some(id) = store::insert(&mut tx, &new).await? {
            advance_locked(&mut tx, id).await?;
            tracing::info!(investigation = %id, run = %s.id, nodes = new.node_ids.len(), "investigation started for a run with a warn or fail verdict");
            started += 1;
        }
        tx.commit().await?;
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::headline;

    #[test]
    fn headline_is_the_mean_at_the_largest_size() {
        assert_eq!(headline(&[]), None);
        assert_eq!(headline(&[(8, None)]), None);
        let rows = [
            (1024, Some(5.0)),
            (1 << 20, Some(40.0)),
            (1 << 20, Some(44.0)),
            (1 << 30, None),
            (1 << 20, Some(f64::NAN)),
        ];
        assert_eq!(
            headline(&rows),
            Some((1 << 20, 42.0)),
            "sizes without a figure do not count"
        );
        assert_eq!(
            headline(&[(8, Some(1.0)), (16, Some(2.0)), (16, Some(4.0))]),
            Some((16, 3.0))
        );
    }
}
