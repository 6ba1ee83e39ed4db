//! A new upload's verdict, in the transaction that stored the result
//! (`jobs::results::store_result`): judged from the figures and context in hand (nothing
//! stored is read back), its series' change points found again, and the result, verdict,
//! points and change points committed together.
//!
//! The result is the agent's data and is kept whatever happens to its judgement: judging
//! runs after a savepoint, and a failure rolls back to it, is logged, and leaves the result
//! without a verdict, which the next upload retry or the pending pass
//! (`judge_pending`, the investigations worker) makes good.

use heddle_types::jobs::ResultUpload;
use sqlx::PgPool;
use uuid::Uuid;

use super::{Judging, Subject, judge};
use crate::health::HealthError;
use crate::health::regress;
use crate::jobs::results::{NewResult, as_stored};

/// Judges the result `new` holds and commits its transaction. Only the commit (or the
/// rollback to the savepoint after a failed judgement) can fail the upload.
pub async fn judge_upload(
    db: &PgPool,
    new: NewResult,
    up: &ResultUpload,
) -> Result<Uuid, sqlx::Error> {
    let NewResult {
        mut tx,
        result_id,
        received_at,
        outcome,
        job,
    } = new;
    sqlx::query!("SAVEPOINT judging").execute(&mut *tx).await?;
    let subject = match (job.spec, job.node) {
        (Some(spec), Some(node)) => Some(Subject {
            outcome: outcome.to_string(),
            reason: up.reason.clone(),
            summary: if up.summary.is_null() {
                serde_json::json!({})
            } else {
                up.summary.clone()
            },
            received_at,
            run_id: job.run_id,
            node_id: job.node_id,
            world_size: job.world_size,
            spec,
            hostname: node.hostname,
            gpu_model: node.gpu_model,
            gpu_count: node.gpu_count,
            facts: node.facts,
        }),
        _ => None,
    };
    let judged = match subject {
        Some(s) => judge_and_detect(&mut tx, db, result_id, &s, up).await,
        None => Err(HealthError::NoSuchResult(result_id)),
    };
    let worse = match judged {
        Ok(worse) => worse,
        Err(err) => {
            tracing::warn!(%result_id, error = %err, "judging a result failed");
            sqlx::query!("ROLLBACK TO SAVEPOINT judging")
                .execute(&mut *tx)
                .await?;
            Vec::new()
        }
    };
    tx.commit().await?;
    // Other nodes' changes counted with the new ones; a failure here leaves the change
    // points standing, and the cohort is counted again by its next change.
    if let Err(err) = regress::refresh_cohorts(db, worse).await {
        tracing::warn!(%result_id, error = %err, "counting a regression's cohort failed");
    }
    Ok(result_id)
}

/// The verdict, then each series the result added to detected again (docs/health.md,
/// "Regressions") from the points the verdict's read brought. Returns the new worse
/// change points.
async fn judge_and_detect(
    conn: &mut sqlx::PgConnection,
    db: &PgPool,
    result_id: Uuid,
    s: &Subject,
    up: &ResultUpload,
) -> Result<Vec<Uuid>, HealthError> {
    let rows: Vec<_> = up.rows.iter().map(as_stored).collect();
    let judged = judge(&mut *conn, db, result_id, s, &rows, Judging::First).await?;
    let mut worse = Vec::new();
    for (key, points) in &judged.series {
        let cfg = regress::config_from(key, &judged.operator, &s.hostname, s.gpu_model.clone());
        let (_, new) = regress::detect_and_store(&mut *conn, key, points, &cfg).await?;
        worse.extend(new);
    }
    Ok(worse)
}
