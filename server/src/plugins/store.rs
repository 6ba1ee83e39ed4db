//! Plugins as stored (`plugin_blobs`, `plugins`, `plugin_versions`): content-addressed
//! component bytes, named versions, which version is enabled. Changes run in the caller's
//! transaction, beside its audit entry. Never sees HTTP: its errors are `sqlx::Error`, and
//! a name or version that is not there is `None` for the caller to say.

use heddle_types::plugins::{Plugin, PluginVersion};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// A version about to be stored: the bytes are already in `plugin_blobs` under `sha256`.
pub struct NewVersion<'a> {
    pub plugin_id: Uuid,
    pub version: &'a str,
    pub sha256: &'a str,
    pub uploaded_by: &'a str,
    pub contract: Option<&'a str>,
    pub description: Option<&'a str>,
}

/// Stores a component's bytes under their hash; the same bytes again change nothing.
pub async fn insert_blob(tx: &mut PgConnection, sha256: &str, bytes: &[u8]) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO plugin_blobs (sha256, bytes, size_bytes) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        sha256,
        bytes,
        i64::try_from(bytes.len()).unwrap_or(i64::MAX),
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// The plugin's id, creating the plugin (disabled, no version) when the name is new.
pub async fn upsert_plugin(tx: &mut PgConnection, name: &str) -> sqlx::Result<Uuid> {
    sqlx::query_scalar!(
        "INSERT INTO plugins (id, name) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
        Uuid::new_v4(),
        name,
    )
    .fetch_one(tx)
    .await
}

/// The hash of the bytes stored under a plugin's version, if it has that version.
pub async fn version_sha256(
    tx: &mut PgConnection,
    plugin_id: Uuid,
    version: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT sha256 FROM plugin_versions WHERE plugin_id = $1 AND version = $2",
        plugin_id,
        version,
    )
    .fetch_optional(tx)
    .await
}

pub async fn insert_version(tx: &mut PgConnection, new: &NewVersion<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO plugin_versions (id, plugin_id, version, sha256, uploaded_by, contract, description)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        Uuid::new_v4(),
        new.plugin_id,
        new.version,
        new.sha256,
        new.uploaded_by,
        new.contract,
        new.description,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// One stored version, as the API shows it.
pub async fn version(
    tx: &mut PgConnection,
    plugin_id: Uuid,
    version: &str,
) -> sqlx::Result<PluginVersion> {
    sqlx::query_as!(
        PluginVersion,
        "SELECT v.id, p.name AS plugin, v.version, v.sha256, b.size_bytes, v.contract,
                v.description, v.uploaded_by, v.created_at
         FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id
         JOIN plugin_blobs b ON b.sha256 = v.sha256
         WHERE v.plugin_id = $1 AND v.version = $2",
        plugin_id,
        version,
    )
    .fetch_one(tx)
    .await
}

/// A plugin's versions, newest first.
pub async fn versions(db: &PgPool, plugin_id: Uuid) -> sqlx::Result<Vec<PluginVersion>> {
    sqlx::query_as!(
        PluginVersion,
        "SELECT v.id, p.name AS plugin, v.version, v.sha256, b.size_bytes, v.contract,
                v.description, v.uploaded_by, v.created_at
         FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id
         JOIN plugin_blobs b ON b.sha256 = v.sha256
         WHERE v.plugin_id = $1 ORDER BY v.created_at DESC",
        plugin_id,
    )
    .fetch_all(db)
    .await
}

/// Every plugin by name, with the version it has enabled.
pub async fn plugins(db: &PgPool) -> sqlx::Result<Vec<Plugin>> {
    sqlx::query_as!(
        Plugin,
        r#"SELECT p.id, p.name, p.enabled, v.version AS "active_version?", p.created_at
         FROM plugins p LEFT JOIN plugin_versions v ON v.id = p.active_version_id
         ORDER BY p.name"#
    )
    .fetch_all(db)
    .await
}

pub async fn plugin(db: &PgPool, id: Uuid) -> sqlx::Result<Plugin> {
    sqlx::query_as!(
        Plugin,
        r#"SELECT p.id, p.name, p.enabled, v.version AS "active_version?", p.created_at
         FROM plugins p LEFT JOIN plugin_versions v ON v.id = p.active_version_id
         WHERE p.id = $1"#,
        id,
    )
    .fetch_one(db)
    .await
}

pub async fn plugin_id(db: &PgPool, name: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!("SELECT id FROM plugins WHERE name = $1", name)
        .fetch_optional(db)
        .await
}

/// A version's plugin id and the hash of its bytes, by names.
pub async fn find_version(
    db: &PgPool,
    name: &str,
    version: &str,
) -> sqlx::Result<Option<(Uuid, String)>> {
    let row = sqlx::query!(
        "SELECT p.id, v.sha256 FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id
         WHERE p.name = $1 AND v.version = $2",
        name,
        version,
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| (r.id, r.sha256)))
}

/// A version's component bytes, by names.
pub async fn version_bytes(
    db: &PgPool,
    name: &str,
    version: &str,
) -> sqlx::Result<Option<Vec<u8>>> {
    sqlx::query_scalar!(
        "SELECT b.bytes FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id
         JOIN plugin_blobs b ON b.sha256 = v.sha256
         WHERE p.name = $1 AND v.version = $2",
        name,
        version,
    )
    .fetch_optional(db)
    .await
}

/// The id and name of a plugin's version: the one named, or its newest when none is.
pub async fn pick_version(
    tx: &mut PgConnection,
    plugin_id: Uuid,
    version: Option<&str>,
) -> sqlx::Result<Option<(Uuid, String)>> {
    let row = sqlx::query!(
        "SELECT id, version FROM plugin_versions
         WHERE plugin_id = $1 AND ($2::text IS NULL OR version = $2)
         ORDER BY created_at DESC LIMIT 1",
        plugin_id,
        version,
    )
    .fetch_optional(tx)
    .await?;
    Ok(row.map(|r| (r.id, r.version)))
}

/// Enables a plugin at a version (`Some`), or disables it (`None`, keeping its version).
pub async fn set_enabled(
    tx: &mut PgConnection,
    plugin_id: Uuid,
    version_id: Option<Uuid>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE plugins SET enabled = $2::uuid IS NOT NULL,
                active_version_id = COALESCE($2, active_version_id)
         WHERE id = $1",
        plugin_id,
        version_id,
    )
    .execute(tx)
    .await?;
    Ok(())
}
