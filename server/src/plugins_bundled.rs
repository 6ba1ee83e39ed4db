//! The first-party plugins (azure-nd, runai-roce, dgx-affinity) ship inside the server: the
//! same components the agent embeds (heddle-plugin-host's `bundled` feature), registered as
//! ordinary plugin rows, enabled, on the first start against a database, so a fresh
//! install recommends an environment without any manual step.
//!
//! After that they are plugins like any other: an admin may disable one, or upload and
//! enable another version, and no later start undoes it. A newer server brings newer
//! builds: a plugin whose active version is still one this module registered moves to the
//! new bytes; one an admin replaced is left alone.

use std::sync::Arc;

use heddle_plugin_host::bundled::FIRST_PARTY;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::db;
use crate::plugins::PluginRuntime;

/// `uploaded_by` of the versions registered here, and the audit actor.
pub const BUNDLED_BY: &str = "heddle-server (bundled)";

/// What happened to one bundled plugin at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// First start: stored and enabled.
    Registered { version: String },
    /// The active version was a bundled one with other bytes; now this build's.
    Upgraded { version: String },
    /// Already this build, or replaced by an admin: nothing to do.
    Unchanged,
}

/// Registers every bundled plugin (see the module docs). Safe on several replicas at once:
/// the plugin row's unique name serialises them.
pub async fn register(
    db: &sqlx::PgPool,
    runtime: &PluginRuntime,
) -> anyhow::Result<Vec<(&'static str, Outcome)>> {
    let mut out = Vec::new();
    for (name, bytes) in FIRST_PARTY {
        let outcome = register_one(db, runtime, name, bytes).await?;
        if outcome != Outcome::Unchanged {
            tracing::info!(plugin = name, ?outcome, "bundled plugin");
        }
        out.push((*name, outcome));
    }
    runtime.wake.notify_waiters();
    Ok(out)
}

async fn register_one(
    db: &sqlx::PgPool,
    runtime: &PluginRuntime,
    name: &str,
    bytes: &[u8],
) -> anyhow::Result<Outcome> {
    let sha = hex::encode(Sha256::digest(bytes));
    // (plugin id, sha256 and uploader of its active version)
    let existing: Option<(Uuid, Option<String>, Option<String>)> = sqlx::query!(
        r#"SELECT p.id, v.sha256 AS "sha256?", v.uploaded_by AS "uploaded_by?" FROM plugins p
         LEFT JOIN plugin_versions v ON v.id = p.active_version_id WHERE p.name = $1"#,
        name,
    )
    .fetch_optional(db)
    .await?
    .map(|r| (r.id, r.sha256, r.uploaded_by));
    let upgrade = match &existing {
        None => false,
        Some((_, Some(active_sha), Some(by))) if by == BUNDLED_BY && *active_sha != sha => true,
        Some(_) => return Ok(Outcome::Unchanged),
    };
    // Only now pay for compiling: the component's own name, version and contract.
    let info = runtime
        .validate(Arc::new(bytes.to_vec()))
        .await
        .map_err(|e| anyhow::anyhow!("bundled plugin {name} does not validate: {e}"))?;
    let mut tx = db.begin().await?;
    sqlx::query!(
        "INSERT INTO plugin_blobs (sha256, bytes, size_bytes) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        sha,
        bytes,
        i64::try_from(bytes.len()).unwrap_or(i64::MAX),
    )
    .execute(&mut *tx)
    .await?;
    let plugin_id = if upgrade {
        existing.map(|(id, _, _)| id).unwrap_or_default()
    } else {
        let inserted = sqlx::query_scalar!(
            "INSERT INTO plugins (id, name, enabled) VALUES ($1, $2, true)
             ON CONFLICT (name) DO NOTHING RETURNING id",
            Uuid::new_v4(),
            name,
        )
        .fetch_optional(&mut *tx)
        .await?;
        match inserted {
            Some(id) => id,
            // Another replica registered it meanwhile.
            None => return Ok(Outcome::Unchanged),
        }
    };
    // A version string already taken by other bytes (a rebuild without a version bump)
    // gets the hash appended, so every stored version keeps its bytes.
    let taken = sqlx::query_scalar!(
        "SELECT sha256 FROM plugin_versions WHERE plugin_id = $1 AND version = $2",
        plugin_id,
        info.plugin.version,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let version = match taken {
        Some(other) if other != sha => format!("{}+{}", info.plugin.version, &sha[..12]),
        _ => info.plugin.version.clone(),
    };
    let version_id = sqlx::query_scalar!(
        "INSERT INTO plugin_versions (id, plugin_id, version, sha256, uploaded_by, contract, description)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (plugin_id, version) DO UPDATE SET version = EXCLUDED.version RETURNING id",
        Uuid::new_v4(),
        plugin_id,
        version,
        sha,
        BUNDLED_BY,
        info.contract,
        info.plugin.description,
    )
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE plugins SET active_version_id = $2 WHERE id = $1",
        plugin_id,
        version_id,
    )
    .execute(&mut *tx)
    .await?;
    let action = if upgrade {
        "plugin.bundled_upgrade"
    } else {
        "plugin.bundled_register"
    };
    db::audit(
        &mut *tx,
        BUNDLED_BY,
        action,
        &format!("plugin:{name}@{version}"),
        serde_json::json!({"sha256": sha, "size_bytes": bytes.len()}),
    )
    .await?;
    tx.commit().await?;
    Ok(if upgrade {
        Outcome::Upgraded { version }
    } else {
        Outcome::Registered { version }
    })
}
