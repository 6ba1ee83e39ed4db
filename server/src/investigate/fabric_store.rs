//! The rows of fabric investigations (`fabric_investigations`, `fabric_tests`): what one is
//! made of, its tests with their figures, and its answer.

use chrono::{DateTime, Utc};
use heddle_types::fabric::investigation::{
    FabricInvestigation, FabricPart, FabricTest, FabricTestState,
};
use heddle_types::fabric::plan::Observation;
use heddle_types::fabric::sim::Answer;
use heddle_types::investigations::InvestigationState;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use super::InvestigateError;

/// A `fabric_investigations` row.
#[derive(sqlx::FromRow, Clone)]
pub(super) struct FabricRow {
    pub id: Uuid,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub label: Option<String>,
    pub state: String,
    pub error: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
    pub suspects: Vec<String>,
    pub nodes: Vec<String>,
    pub max_nodes: i32,
    pub max_rounds: i32,
    pub suspects_only: bool,
    /// Nodes running a job may be tested.
    pub include_busy: bool,
    pub timeout_s: i32,
    pub seed: i64,
    pub evidence: Json<Vec<Observation>>,
    pub round: i32,
    pub answer: Option<Json<Stored>>,
    /// What creating it left out, and why.
    pub notes: Vec<String>,
}

/// The answer as stored: the planner's, and its parts in the fabric's terms.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(super) struct Stored {
    pub answer: Answer,
    pub blamed: Vec<FabricPart>,
    pub candidates: Vec<FabricPart>,
}

/// A `fabric_tests` row.
#[derive(sqlx::FromRow, Clone)]
pub(super) struct TestRow {
    pub test_id: String,
    pub round: i32,
    pub nodes: Vec<String>,
    pub rail: Option<i32>,
    pub bytes: i64,
    pub run_id: Option<Uuid>,
    pub state: String,
    pub busbw_gbs: Option<f64>,
    pub error: Option<String>,
    pub seconds: Option<f64>,
}

impl TestRow {
    pub fn state(&self) -> Result<FabricTestState, InvestigateError> {
        self.state
            .parse()
            .map_err(|message| InvestigateError::Corrupt {
                what: "fabric test state",
                message,
            })
    }

    /// The number in its id (`t12` → 12), for ordering.
    fn number(&self) -> u64 {
        self.test_id[1..].parse().unwrap_or(u64::MAX)
    }
}

pub(super) async fn insert(tx: &mut PgConnection, row: &FabricRow) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO fabric_investigations (id, created_by, label, suspects, nodes, max_nodes,
            max_rounds, suspects_only, include_busy, timeout_s, seed, evidence, notes)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
        row.id,
        row.created_by,
        row.label,
        &row.suspects,
        &row.nodes,
        row.max_nodes,
        row.max_rounds,
        row.suspects_only,
        row.include_busy,
        row.timeout_s,
        row.seed,
        &row.evidence as _,
        &row.notes,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// The investigation's row, locked for this transaction, when it is running and no other
/// transaction holds it.
pub(super) async fn lock_running(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<Option<FabricRow>, sqlx::Error> {
    sqlx::query_as!(
        FabricRow,
        r#"SELECT id, created_at, created_by, label, state, error, finished_at, suspects, nodes, max_nodes,
                max_rounds, suspects_only, include_busy, timeout_s, seed,
                evidence AS "evidence: Json<Vec<Observation>>", round,
                answer AS "answer: Json<Stored>", notes
         FROM fabric_investigations
         WHERE id = $1 AND state = 'running' FOR UPDATE SKIP LOCKED"#,
        id,
    )
    .fetch_optional(tx)
    .await
}

pub(super) async fn running_ids(db: &sqlx::PgPool) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT id FROM fabric_investigations WHERE state = 'running' ORDER BY created_at"
    )
    .fetch_all(db)
    .await
}

pub(super) async fn tests(tx: &mut PgConnection, id: Uuid) -> Result<Vec<TestRow>, sqlx::Error> {
    let mut rows = sqlx::query_as!(
        TestRow,
        "SELECT test_id, round, nodes, rail, bytes, run_id, state, busbw_gbs, error, seconds
         FROM fabric_tests WHERE investigation_id = $1",
        id,
    )
    .fetch_all(tx)
    .await?;
    rows.sort_by_key(|t| (t.round, t.number()));
    Ok(rows)
}

/// Stores a test of the round being started: running under `run_id`, or skipped with why.
pub(super) async fn insert_test(
    tx: &mut PgConnection,
    id: Uuid,
    t: &TestRow,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO fabric_tests (investigation_id, test_id, round, nodes, rail, bytes, run_id, state, error)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        id,
        t.test_id,
        t.round,
        &t.nodes,
        t.rail,
        t.bytes,
        t.run_id,
        t.state,
        t.error,
    )
    .execute(tx)
    .await?;
    Ok(())
}

pub(super) async fn set_round(
    tx: &mut PgConnection,
    id: Uuid,
    round: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE fabric_investigations SET round = $2 WHERE id = $1",
        id,
        round
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// A running test whose run ended, with what its jobs say.
#[derive(sqlx::FromRow)]
pub(super) struct Ended {
    pub test_id: String,
    pub run_id: Option<Uuid>,
    pub jobs: i64,
    pub ok: i64,
    pub why: Option<String>,
    /// From the first result's start to the last one's finish.
    pub seconds: Option<f64>,
}

/// The running tests whose runs have ended (or were deleted).
pub(super) async fn ended(tx: &mut PgConnection, id: Uuid) -> Result<Vec<Ended>, sqlx::Error> {
    sqlx::query_as!(
        Ended,
        r#"SELECT t.test_id, t.run_id, count(j.id) AS "jobs!",
                count(j.id) FILTER (WHERE j.state = 'succeeded') AS "ok!",
                string_agg(format('%s %s: %s', n.hostname, j.state, coalesce(r.reason, j.error, 'no reason given')), '; ' ORDER BY j.rank)
                    FILTER (WHERE j.state <> 'succeeded') AS why,
                extract(epoch FROM max(r.finished_at) - min(r.started_at))::float8 AS seconds
         FROM fabric_tests t
         LEFT JOIN jobs j ON j.run_id = t.run_id
         LEFT JOIN nodes n ON n.id = j.node_id
         LEFT JOIN results r ON r.job_id = j.id
         WHERE t.investigation_id = $1 AND t.state = 'running'
         GROUP BY t.test_id, t.run_id
         HAVING count(j.id) = 0
             OR count(j.id) = count(j.id) FILTER (WHERE j.state IN ('succeeded', 'failed', 'cancelled', 'skipped'))"#,
        id,
    )
    .fetch_all(tx)
    .await
}

/// The bus bandwidth rows (size, busbw) of the given runs' results.
pub(super) async fn busbw_rows(
    tx: &mut PgConnection,
    runs: &[Uuid],
) -> Result<Vec<(Uuid, i64, Option<f64>)>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT j.run_id, rr.size_bytes, rr.busbw_gbs FROM result_rows rr
         JOIN results r ON r.id = rr.result_id JOIN jobs j ON j.id = r.job_id
         WHERE j.run_id = ANY($1)",
        runs,
    )
    .fetch_all(tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.run_id, r.size_bytes, r.busbw_gbs))
        .collect())
}

pub(super) async fn finish_test(
    tx: &mut PgConnection,
    id: Uuid,
    test: &str,
    busbw: Option<f64>,
    error: Option<&str>,
    seconds: Option<f64>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE fabric_tests SET state = CASE WHEN $3::float8 IS NULL THEN 'failed' ELSE 'done' END,
                busbw_gbs = $3, error = $4, seconds = $5
         WHERE investigation_id = $1 AND test_id = $2",
        id,
        test,
        busbw,
        error,
        seconds,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Whether a test of the investigation still runs.
pub(super) async fn any_running(tx: &mut PgConnection, id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM fabric_tests WHERE investigation_id = $1 AND state = 'running') AS "any!""#,
        id,
    )
    .fetch_one(tx)
    .await
}

/// The runs of the investigation's running tests.
pub(super) async fn running_runs(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT run_id AS "run_id!" FROM fabric_tests
         WHERE investigation_id = $1 AND state = 'running' AND run_id IS NOT NULL"#,
        id,
    )
    .fetch_all(tx)
    .await
}

/// Stores the answer; `blamed_nodes` are the nodes whose traffic crosses what it blames.
pub(super) async fn finish(
    tx: &mut PgConnection,
    id: Uuid,
    stored: &Stored,
    blamed_nodes: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE fabric_investigations SET state = 'done', answer = $2, blamed_nodes = $3, finished_at = now()
         WHERE id = $1",
        id,
        Json(stored) as _,
        blamed_nodes,
    )
    .execute(tx)
    .await?;
    Ok(())
}

pub(super) async fn fail(tx: &mut PgConnection, id: Uuid, why: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE fabric_investigations SET state = 'failed', error = $2, finished_at = now() WHERE id = $1",
        id,
        why,
    )
    .execute(tx)
    .await?;
    tracing::warn!(investigation = %id, why, "fabric investigation failed");
    Ok(())
}

/// The condition of a busy node (`n`): a Heddle job leased or running, or a user's job
/// observed in the last two minutes.
const BUSY: &str =
    "(EXISTS (SELECT 1 FROM jobs j WHERE j.node_id = n.id AND j.state IN ('leased', 'running'))
     OR EXISTS (SELECT 1 FROM observed_jobs o WHERE o.node_id = n.id
                AND o.last_seen_at > now() - interval '2 minutes'))";

/// Enrolled nodes among `names`, seen within `online_s`, and (unless `busy` is allowed)
/// not busy ([`BUSY`]).
pub(super) async fn available(
    tx: &mut PgConnection,
    names: &[String],
    online_s: f64,
    busy: bool,
) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    // Run time: BUSY is shared with `busy`
    // (fabric_investigations::requests_are_checked_and_the_first_round_runs_on_idle_nodes).
    sqlx::query_as(&format!(
        "SELECT n.id, n.hostname FROM nodes n
         WHERE n.hostname = ANY($1) AND n.last_seen_at >= now() - make_interval(secs => $2)
           AND ($3 OR NOT {BUSY})"
    ))
    .bind(names)
    .bind(online_s)
    .bind(busy)
    .fetch_all(tx)
    .await
}

/// The busy nodes ([`BUSY`]) among `names`: a round leaves their tests out.
pub(super) async fn busy(
    tx: &mut PgConnection,
    names: &[String],
) -> Result<Vec<String>, sqlx::Error> {
    // Run time: BUSY is shared with `available`
    // (fabric_investigations::a_node_that_becomes_busy_is_left_out_of_the_next_round).
    let rows: Vec<(String,)> = sqlx::query_as(&format!(
        "SELECT n.hostname FROM nodes n WHERE n.hostname = ANY($1) AND {BUSY}"
    ))
    .bind(names)
    .fetch_all(tx)
    .await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

/// Node ids by hostname, for the nodes of a round's tests.
pub(super) async fn node_ids(
    tx: &mut PgConnection,
    names: &[String],
) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT id, hostname FROM nodes WHERE hostname = ANY($1)",
        names
    )
    .fetch_all(tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.hostname)).collect())
}

/// One investigation as the API answers it, with its tests.
pub async fn load(db: &sqlx::PgPool, id: Uuid) -> Result<FabricInvestigation, InvestigateError> {
    let mut conn = db.acquire().await?;
    let row = sqlx::query_as!(
        FabricRow,
        r#"SELECT id, created_at, created_by, label, state, error, finished_at, suspects, nodes, max_nodes,
                max_rounds, suspects_only, include_busy, timeout_s, seed,
                evidence AS "evidence: Json<Vec<Observation>>", round,
                answer AS "answer: Json<Stored>", notes
         FROM fabric_investigations WHERE id = $1"#,
        id,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let row = row.ok_or(InvestigateError::NoSuchInvestigation(id))?;
    let tests = tests(&mut conn, id).await?;
    view(row, Some(tests))
}

/// The newest investigations first, at most `limit`, without their tests.
pub async fn list(
    db: &sqlx::PgPool,
    limit: i64,
) -> Result<Vec<FabricInvestigation>, InvestigateError> {
    let rows = sqlx::query_as!(
        FabricRow,
        r#"SELECT id, created_at, created_by, label, state, error, finished_at, suspects, nodes, max_nodes,
                max_rounds, suspects_only, include_busy, timeout_s, seed,
                evidence AS "evidence: Json<Vec<Observation>>", round,
                answer AS "answer: Json<Stored>", notes
         FROM fabric_investigations
         ORDER BY created_at DESC, id LIMIT $1"#,
        limit,
    )
    .fetch_all(db)
    .await?;
    rows.into_iter().map(|r| view(r, None)).collect()
}

fn view(
    row: FabricRow,
    tests: Option<Vec<TestRow>>,
) -> Result<FabricInvestigation, InvestigateError> {
    let state: InvestigationState =
        row.state
            .parse()
            .map_err(|message| InvestigateError::Corrupt {
                what: "investigation state",
                message,
            })?;
    let mut out = Vec::new();
    for t in tests.unwrap_or_default() {
        out.push(FabricTest {
            state: t.state()?,
            round: t.round as u32,
            id: t.test_id,
            nodes: t.nodes,
            rail: t.rail.map(|r| r as u32),
            bytes: t.bytes as u64,
            run_id: t.run_id,
            busbw_gbs: t.busbw_gbs,
            error: t.error,
            seconds: t.seconds,
        });
    }
    let (blamed, candidates, conclusive, notes, node_seconds) = match row.answer {
        Some(Json(s)) => (
            s.blamed,
            s.candidates,
            Some(s.answer.conclusive),
            s.answer.notes,
            s.answer.node_seconds,
        ),
        None => (Vec::new(), Vec::new(), None, row.notes, 0.0),
    };
    Ok(FabricInvestigation {
        id: row.id,
        state,
        label: row.label,
        created_by: row.created_by,
        created_at: row.created_at,
        finished_at: row.finished_at,
        error: row.error,
        suspects: row.suspects,
        nodes_available: row.nodes.len() as u32,
        max_nodes: row.max_nodes as u32,
        max_rounds: row.max_rounds as u32,
        round: row.round as u32,
        tests: out,
        blamed,
        candidates,
        conclusive,
        notes,
        node_seconds,
    })
}

/// The answers of investigations finished within `hours` that blame something `node`'s
/// traffic crosses, newest first.
pub(super) async fn blaming(
    db: &sqlx::PgPool,
    node: &str,
    hours: i64,
) -> Result<Vec<(Uuid, Json<Stored>)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT id, answer AS "answer!: Json<Stored>" FROM fabric_investigations
         WHERE $1 = ANY(blamed_nodes) AND state = 'done' AND answer IS NOT NULL
           AND finished_at > now() - make_interval(hours => $2)
         ORDER BY finished_at DESC LIMIT 10"#,
        node,
        hours as i32,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.answer)).collect())
}
