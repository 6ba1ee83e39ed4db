//! Creating, reading and listing investigations.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use heddle_types::investigations::*;
use heddle_types::jobs::JobSpec;
use sqlx::types::Json;
use uuid::Uuid;

use super::{InvestigateError, culprit, schedule};
use crate::db;

/// An `investigations` row.
#[derive(Clone)]
pub(super) struct InvRow {
    pub id: Uuid,
    pub kind: String,
    pub params: serde_json::Value,
    pub env: Json<BTreeMap<String, String>>,
    pub timeout_s: Option<i32>,
    pub batch_size: i32,
    pub threshold: f64,
    pub node_ids: Vec<Uuid>,
    pub label: Option<String>,
    pub state: String,
    pub error: Option<String>,
    pub trigger_run_id: Option<Uuid>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The investigation's row, locked for this transaction, when it is running and no other
/// transaction holds it.
pub(super) async fn lock_running(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
) -> Result<Option<InvRow>, sqlx::Error> {
    sqlx::query_as!(
        InvRow,
        r#"SELECT id, kind, params, env AS "env: Json<BTreeMap<String, String>>", timeout_s,
                batch_size, threshold, node_ids, label, state, error, trigger_run_id, created_by,
                created_at, finished_at
         FROM investigations WHERE id = $1 AND state = 'running' FOR UPDATE SKIP LOCKED"#,
        id,
    )
    .fetch_optional(tx)
    .await
}

impl InvRow {
    pub fn kind(&self) -> Result<InvestigationKind, InvestigateError> {
        self.kind
            .parse()
            .map_err(|message| InvestigateError::Corrupt {
                what: "investigation kind",
                message,
            })
    }

    /// What every pair's run executes.
    pub fn spec(&self) -> JobSpec {
        JobSpec {
            env: self.env.0.clone(),
            timeout_s: self.timeout_s.and_then(|t| u32::try_from(t).ok()),
            ..JobSpec::new(self.kind.clone(), self.params.clone())
        }
    }
}

struct PairRow {
    a: i32,
    b: i32,
    batch: i32,
    state: String,
    run_id: Option<Uuid>,
    value: Option<f64>,
    size_bytes: Option<i64>,
    error: Option<String>,
}

/// What a new investigation is made of, checked.
pub(super) struct NewInvestigation<'a> {
    pub spec: JobSpec,
    pub node_ids: Vec<Uuid>,
    pub batch_size: i32,
    pub threshold: f64,
    pub label: Option<String>,
    pub trigger_run_id: Option<Uuid>,
    pub actor: &'a str,
}

/// Stores an investigation and its pairs. `None` when the trigger run already has one.
pub(super) async fn insert(
    tx: &mut sqlx::PgConnection,
    new: &NewInvestigation<'_>,
) -> Result<Option<Uuid>, sqlx::Error> {
    let id = Uuid::new_v4();
    let inserted = sqlx::query_scalar!(
        "INSERT INTO investigations (id, kind, params, env, timeout_s, batch_size, threshold, node_ids, label, trigger_run_id, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (trigger_run_id) DO NOTHING RETURNING id",
        id,
        new.spec.kind,
        match new.spec.params.raw() {
            serde_json::Value::Null => serde_json::json!({}),
            given => given.clone(),
        },
        Json(&new.spec.env) as _,
        new.spec.timeout_s.map(|t| i32::try_from(t).unwrap_or(i32::MAX)),
        new.batch_size,
        new.threshold,
        &new.node_ids,
        new.label,
        new.trigger_run_id,
        new.actor,
    )
    .fetch_optional(&mut *tx)
    .await?;
    if inserted.is_none() {
        return Ok(None);
    }
    let k = usize::try_from(new.batch_size).unwrap_or(0);
    let (mut a, mut b, mut batch) = (Vec::new(), Vec::new(), Vec::new());
    for (i, pairs) in schedule::batches(new.node_ids.len(), k).iter().enumerate() {
        for &(x, y) in pairs {
            a.push(x as i32);
            b.push(y as i32);
            batch.push(i as i32);
        }
    }
    sqlx::query!(
        "INSERT INTO investigation_pairs (investigation_id, a, b, batch)
         SELECT $1, a, b, batch FROM unnest($2::int[], $3::int[], $4::int[]) AS t(a, b, batch)",
        id,
        &a,
        &b,
        &batch,
    )
    .execute(&mut *tx)
    .await?;
    db::audit(&mut *tx, new.actor, "investigation.create", &format!("investigation:{id}"),
        serde_json::json!({"kind": new.spec.kind, "nodes": new.node_ids, "pairs": a.len(), "trigger_run_id": new.trigger_run_id}))
    .await?;
    Ok(Some(id))
}

async fn hostnames(db: &sqlx::PgPool, ids: &[Uuid]) -> Result<HashMap<Uuid, String>, sqlx::Error> {
    let rows = sqlx::query!("SELECT id, hostname FROM nodes WHERE id = ANY($1)", ids)
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.hostname)).collect())
}

fn parse_pair_state(s: &str) -> Result<PairState, InvestigateError> {
    Ok(match s {
        "pending" => PairState::Pending,
        "running" => PairState::Running,
        "done" => PairState::Done,
        "failed" => PairState::Failed,
        other => {
            return Err(InvestigateError::Corrupt {
                what: "pair state",
                message: other.to_string(),
            });
        }
    })
}

fn progress(pairs: &[PairRow]) -> InvestigationProgress {
    let count = |s: &str| pairs.iter().filter(|p| p.state == s).count() as u32;
    InvestigationProgress {
        pairs_total: pairs.len() as u32,
        pairs_done: count("done") + count("failed"),
        pairs_failed: count("failed"),
        pairs_running: count("running"),
        batches_total: pairs.iter().map(|p| p.batch + 1).max().unwrap_or(0) as u32,
    }
}

/// The node×node matrix of the pairs' figures (symmetric, empty diagonal).
fn matrix(kind: InvestigationKind, labels: Vec<String>, pairs: &[PairRow]) -> Matrix {
    let n = labels.len();
    let mut values = vec![vec![None; n]; n];
    for p in pairs {
        let (a, b) = (p.a as usize, p.b as usize);
        if a < n && b < n {
            values[a][b] = p.value;
            values[b][a] = p.value;
        }
    }
    Matrix {
        labels,
        metric: kind.metric().to_string(),
        unit: "GB/s".into(),
        values,
    }
}

struct Loaded {
    row: InvRow,
    kind: InvestigationKind,
    state: InvestigationState,
    nodes: Vec<InvestigationNode>,
    pairs: Vec<PairRow>,
    matrix: Matrix,
    analysis: Analysis,
}

async fn load_parts(db: &sqlx::PgPool, row: InvRow) -> Result<Loaded, InvestigateError> {
    let kind = row.kind()?;
    let state: InvestigationState =
        row.state
            .parse()
            .map_err(|message| InvestigateError::Corrupt {
                what: "investigation state",
                message,
            })?;
    let names = hostnames(db, &row.node_ids).await?;
    let nodes: Vec<InvestigationNode> = row
        .node_ids
        .iter()
        .map(|id| InvestigationNode {
            id: *id,
            hostname: names.get(id).cloned().unwrap_or_else(|| id.to_string()),
        })
        .collect();
    let pairs = sqlx::query_as!(
        PairRow,
        "SELECT a, b, batch, state, run_id, value, size_bytes, error FROM investigation_pairs
         WHERE investigation_id = $1 ORDER BY batch, a, b",
        row.id,
    )
    .fetch_all(db)
    .await?;
    let matrix = matrix(
        kind,
        nodes.iter().map(|n| n.hostname.clone()).collect(),
        &pairs,
    );
    let analysis = if state == InvestigationState::Running {
        let p = progress(&pairs);
        Analysis {
            verdict: Conclusion::Pending,
            culprits: Vec::new(),
            median: None,
            threshold: row.threshold,
            missing: Vec::new(),
            summary: format!("{} of {} pairs measured", p.pairs_done, p.pairs_total),
        }
    } else {
        let mut a = culprit::analyse(&matrix, row.threshold, culprit::NODES);
        if let Some(err) = &row.error {
            a.summary = format!("{err}; {}", a.summary);
        }
        a
    };
    Ok(Loaded {
        row,
        kind,
        state,
        nodes,
        pairs,
        matrix,
        analysis,
    })
}

pub async fn load(db: &sqlx::PgPool, id: Uuid) -> Result<Investigation, InvestigateError> {
    let row = sqlx::query_as!(
        InvRow,
        r#"SELECT id, kind, params, env AS "env: Json<BTreeMap<String, String>>", timeout_s,
                batch_size, threshold, node_ids, label, state, error, trigger_run_id, created_by,
                created_at, finished_at
         FROM investigations WHERE id = $1"#,
        id,
    )
    .fetch_optional(db)
    .await?
    .ok_or(InvestigateError::NoSuchInvestigation(id))?;
    let l = load_parts(db, row).await?;
    let host = |i: i32| {
        l.nodes
            .get(i as usize)
            .map_or_else(|| i.to_string(), |n| n.hostname.clone())
    };
    let pairs = l
        .pairs
        .iter()
        .map(|p| {
            Ok(InvestigationPair {
                a: host(p.a),
                b: host(p.b),
                batch: p.batch,
                state: parse_pair_state(&p.state)?,
                run_id: p.run_id,
                value: p.value,
                size_bytes: p.size_bytes,
                error: p.error.clone(),
            })
        })
        .collect::<Result<Vec<_>, InvestigateError>>()?;
    let r = &l.row;
    Ok(Investigation {
        id: r.id,
        kind: l.kind,
        params: r.params.clone(),
        env: r.env.0.clone(),
        timeout_s: r.timeout_s.and_then(|t| u32::try_from(t).ok()),
        batch_size: u32::try_from(r.batch_size).unwrap_or(0),
        threshold: r.threshold,
        label: r.label.clone(),
        state: l.state,
        error: r.error.clone(),
        trigger_run_id: r.trigger_run_id,
        created_by: r.created_by.clone(),
        created_at: r.created_at,
        finished_at: r.finished_at,
        progress: progress(&l.pairs),
        runs: l.pairs.iter().filter_map(|p| p.run_id).collect(),
        nodes: l.nodes,
        matrix: l.matrix,
        analysis: l.analysis,
        pairs,
    })
}

/// Newest first; `state` filters.
pub async fn list(
    db: &sqlx::PgPool,
    state: Option<InvestigationState>,
    limit: i64,
) -> Result<Vec<InvestigationSummary>, InvestigateError> {
    let rows = sqlx::query_as!(
        InvRow,
        r#"SELECT id, kind, params, env AS "env: Json<BTreeMap<String, String>>", timeout_s,
                batch_size, threshold, node_ids, label, state, error, trigger_run_id, created_by,
                created_at, finished_at
         FROM investigations WHERE ($1::text IS NULL OR state = $1)
         ORDER BY created_at DESC LIMIT $2"#,
        state.map(InvestigationState::as_str),
        limit,
    )
    .fetch_all(db)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let l = load_parts(db, row).await?;
        out.push(InvestigationSummary {
            id: l.row.id,
            kind: l.kind,
            state: l.state,
            label: l.row.label.clone(),
            trigger_run_id: l.row.trigger_run_id,
            nodes: l.nodes.iter().map(|n| n.hostname.clone()).collect(),
            progress: progress(&l.pairs),
            verdict: l.analysis.verdict,
            culprits: l.analysis.culprits,
            created_by: l.row.created_by.clone(),
            created_at: l.row.created_at,
            finished_at: l.row.finished_at,
        });
    }
    Ok(out)
}
