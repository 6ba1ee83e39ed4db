//! The site's fabric (docs/fabric.md): one current document, read from its source by the
//! importers of `heddle_types::fabric` and stored with who imported it, from what and
//! when. An import replaces the document in one transaction with its audit-log entry.
//! Never sees HTTP: its errors are [`FabricError`].

use chrono::{DateTime, Utc};
use heddle_types::fabric::stored::{FabricSource, FabricSummary, StoredFabric};
use heddle_types::fabric::{Errors, Fabric};
use sqlx::PgPool;
use sqlx::types::Json;

use crate::db;

#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// The text does not read as its source says; every error names its line or item.
    #[error("the {from} text does not read as a fabric:\n{errors}")]
    Invalid { from: FabricSource, errors: Errors },
    #[error(
        "no fabric imported yet: heddle fabric import --slurm-topology FILE \
         (or --ibnetdiscover FILE, or --file FILE for a Heddle fabric file)"
    )]
    NoneYet,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("the stored fabric does not decode: {0}")]
    Decode(String),
    #[error("reading the fabric stopped: {0}")]
    Reader(#[from] tokio::task::JoinError),
}

/// Reads `text` as `source` says, off the async threads: a large file takes a while.
pub async fn read(source: FabricSource, text: String) -> Result<Fabric, FabricError> {
    tokio::task::spawn_blocking(move || source.read(&text))
        .await?
        .map_err(|errors| FabricError::Invalid {
            from: source,
            errors,
        })
}

/// Makes `fabric` the site's fabric, in one transaction with its audit-log entry.
pub async fn store(
    db: &PgPool,
    fabric: &Fabric,
    source: FabricSource,
    actor: &str,
) -> Result<FabricSummary, FabricError> {
    let mut tx = db.begin().await?;
    let imported_at: DateTime<Utc> = sqlx::query_scalar!(
        "INSERT INTO fabric (id, source, document, imported_at, imported_by)
         VALUES (true, $1, $2, now(), $3)
         ON CONFLICT (id) DO UPDATE SET source = EXCLUDED.source, document = EXCLUDED.document,
             imported_at = EXCLUDED.imported_at, imported_by = EXCLUDED.imported_by
         RETURNING imported_at",
        source.as_str(),
        Json(fabric) as _,
        actor,
    )
    .fetch_one(&mut *tx)
    .await?;
    let summary = FabricSummary::of(fabric, source, imported_at, actor.to_string());
    db::audit(
        &mut *tx,
        actor,
        "fabric.import",
        "fabric",
        serde_json::json!({
            "source": source.as_str(),
            "nodes": summary.nodes,
            "switches": summary.switches,
            "links": summary.links,
            "notes": summary.notes,
        }),
    )
    .await?;
    tx.commit().await?;
    tracing::info!(
        %source,
        nodes = summary.nodes,
        switches = summary.switches,
        links = summary.links,
        "fabric imported"
    );
    Ok(summary)
}

/// The site's fabric, or [`FabricError::NoneYet`].
pub async fn current<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<StoredFabric, FabricError> {
    let row = sqlx::query!(
        r#"SELECT source, document AS "document: Json<Fabric>", imported_at, imported_by
         FROM fabric WHERE id"#
    )
    .fetch_optional(db)
    .await
    .map_err(|e| match e {
        sqlx::Error::ColumnDecode { source, .. } => FabricError::Decode(source.to_string()),
        other => other.into(),
    })?
    .map(|r| (r.source, r.document, r.imported_at, r.imported_by));
    let (source, Json(fabric), imported_at, imported_by) = row.ok_or(FabricError::NoneYet)?;
    let source: FabricSource = source.parse().map_err(FabricError::Decode)?;
    Ok(StoredFabric {
        summary: FabricSummary::of(&fabric, source, imported_at, imported_by),
        fabric,
    })
}
