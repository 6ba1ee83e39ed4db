//! Operators' expectations as stored (`expectations`): added, listed, deleted, and read by
//! test for judging. Changes run in the caller's transaction, beside its audit entry.

use chrono::{DateTime, Utc};
use heddle_types::health::{Expectation, ExpectationCreate};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[derive(sqlx::FromRow)]
struct ExpectationRow {
    id: Uuid,
    test: String,
    metric: String,
    min_size_bytes: i64,
    value: f64,
    source: String,
    gpu_model: Option<String>,
    gpu_count: Option<i32>,
    world_size: Option<i32>,
    hostname: Option<String>,
    created_by: String,
    created_at: DateTime<Utc>,
}

impl From<ExpectationRow> for Expectation {
    fn from(r: ExpectationRow) -> Self {
        Expectation {
            id: Some(r.id),
            origin: "operator".into(),
            test: r.test,
            metric: r.metric,
            min_size_bytes: r.min_size_bytes,
            value: r.value,
            source: r.source,
            gpu_model: r.gpu_model,
            gpu_count: r.gpu_count,
            world_size: r.world_size,
            node: r.hostname,
            created_by: Some(r.created_by),
            created_at: Some(r.created_at),
        }
    }
}

/// Operator expectations for these tests (all nodes; `applies` filters by node), oldest
/// first.
pub async fn from_operators(
    db: &PgPool,
    tests: &[String],
) -> Result<Vec<Expectation>, sqlx::Error> {
    let rows = sqlx::query_as!(
        ExpectationRow,
        r#"SELECT e.id, e.test, e.metric, e.min_size_bytes, e.value, e.source, e.gpu_model,
                e.gpu_count, e.world_size, n.hostname AS "hostname?", e.created_by, e.created_at
         FROM expectations e LEFT JOIN nodes n ON n.id = e.node_id
         WHERE e.test = ANY($1) ORDER BY e.created_at"#,
        tests,
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Every operator expectation, by test and then age.
pub async fn all(db: &PgPool) -> sqlx::Result<Vec<Expectation>> {
    let rows = sqlx::query_as!(
        ExpectationRow,
        r#"SELECT e.id, e.test, e.metric, e.min_size_bytes, e.value, e.source, e.gpu_model,
                e.gpu_count, e.world_size, n.hostname AS "hostname?", e.created_by, e.created_at
         FROM expectations e LEFT JOIN nodes n ON n.id = e.node_id
         ORDER BY e.test, e.created_at"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Stores a checked expectation under `id` for `node_id` (every node when `None`).
pub async fn insert(
    tx: &mut PgConnection,
    id: Uuid,
    req: &ExpectationCreate,
    node_id: Option<Uuid>,
    created_by: &str,
) -> sqlx::Result<Expectation> {
    sqlx::query!(
        "INSERT INTO expectations (id, test, metric, min_size_bytes, value, source, gpu_model,
                gpu_count, world_size, node_id, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        id,
        req.test,
        req.metric,
        req.min_size_bytes.unwrap_or(0),
        req.value,
        req.source.trim(),
        req.gpu_model,
        req.gpu_count,
        req.world_size,
        node_id,
        created_by,
    )
    .execute(&mut *tx)
    .await?;
    let row = sqlx::query_as!(
        ExpectationRow,
        r#"SELECT e.id, e.test, e.metric, e.min_size_bytes, e.value, e.source, e.gpu_model,
                e.gpu_count, e.world_size, n.hostname AS "hostname?", e.created_by, e.created_at
         FROM expectations e LEFT JOIN nodes n ON n.id = e.node_id WHERE e.id = $1"#,
        id,
    )
    .fetch_one(tx)
    .await?;
    Ok(row.into())
}

/// Deletes an operator's expectation, returning its test and metric; `None` when there is
/// none by that id.
pub async fn delete(tx: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<(String, String)>> {
    let row = sqlx::query!(
        "DELETE FROM expectations WHERE id = $1 RETURNING test, metric",
        id
    )
    .fetch_optional(tx)
    .await?;
    Ok(row.map(|r| (r.test, r.metric)))
}
