//! Plugin storage: content-addressed component blobs, named versions, enable/disable and
//! rollback (enable an older version).

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use heddle_types::auth::Role;
use heddle_types::plugins::*;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path};
use crate::plugins::outcomes;
use crate::state::AppState;

/// The first 8 bytes of a WebAssembly component (magic, then component-model layer 1).
/// Core modules have `01 00 00 00` after the magic and are refused: plugins are components.
const COMPONENT_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// Cheap structural checks done before anything is stored.
pub fn check_component_bytes(bytes: &[u8], max: usize) -> Result<(), ApiError> {
    if bytes.len() > max {
        return Err(ApiError::PayloadTooLarge(format!(
            "plugin is {} bytes; the limit is {max}",
            bytes.len()
        )));
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(ApiError::Unprocessable(
            "not a WebAssembly binary (no \\0asm header)".into(),
        ));
    }
    if bytes[..8] != COMPONENT_HEADER {
        return Err(ApiError::Unprocessable(
            "a core WebAssembly module, not a component: build with --target wasm32-wasip2 (or run `wasm-tools component new`)".into(),
        ));
    }
    Ok(())
}

fn check_version(version: &str) -> Result<(), ApiError> {
    let ok = !version.is_empty()
        && version.len() <= 64
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "version {version:?} must be 1-64 of letters, digits, '.', '-', '+'"
        )))
    }
}

#[derive(sqlx::FromRow)]
struct PluginRow {
    id: Uuid,
    name: String,
    enabled: bool,
    active_version: Option<String>,
    created_at: DateTime<Utc>,
}

impl From<PluginRow> for Plugin {
    fn from(r: PluginRow) -> Self {
        Plugin {
            id: r.id,
            name: r.name,
            enabled: r.enabled,
            active_version: r.active_version,
            created_at: r.created_at,
        }
    }
}

const PLUGIN_SELECT: &str =
    "SELECT p.id, p.name, p.enabled, v.version AS active_version, p.created_at
    FROM plugins p LEFT JOIN plugin_versions v ON v.id = p.active_version_id";

#[derive(sqlx::FromRow)]
struct VersionRow {
    id: Uuid,
    plugin: String,
    version: String,
    sha256: String,
    size_bytes: i64,
    contract: Option<String>,
    description: Option<String>,
    uploaded_by: String,
    created_at: DateTime<Utc>,
}

impl From<VersionRow> for PluginVersion {
    fn from(r: VersionRow) -> Self {
        PluginVersion {
            id: r.id,
            plugin: r.plugin,
            version: r.version,
            sha256: r.sha256,
            size_bytes: r.size_bytes,
            contract: r.contract,
            description: r.description,
            uploaded_by: r.uploaded_by,
            created_at: r.created_at,
        }
    }
}

const VERSION_SELECT: &str = "SELECT v.id, p.name AS plugin, v.version, v.sha256, b.size_bytes, v.contract, v.description, v.uploaded_by, v.created_at
    FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id JOIN plugin_blobs b ON b.sha256 = v.sha256";

/// Upload a plugin version (the raw component bytes as the body). Uploading the same bytes
/// again is a no-op; other bytes under an existing version are refused.
#[utoipa::path(post, path = "/api/v1/plugins/{name}/versions/{version}", tag = "plugins", security(("bearer" = [])),
    params(("name" = String, Path), ("version" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 201, body = PluginVersion), (status = 200, body = PluginVersion, description = "identical version already stored"),
        (status = 409, body = heddle_types::ErrorBody), (status = 413, body = heddle_types::ErrorBody), (status = 422, body = heddle_types::ErrorBody)))]
pub async fn upload(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<PluginVersion>)> {
    caller.require(Role::Admin)?;
    db::check_name("plugin name", &name)?;
    check_version(&version)?;
    let bytes = body?;
    check_component_bytes(&bytes, state.config.max_plugin_bytes)?;
    // The full check: parses, compiles, and checks the world and every import. Nothing is
    // stored unless it passes.
    let bytes = std::sync::Arc::new(bytes.to_vec());
    let info = state
        .plugins
        .validate(bytes.clone())
        .await
        .map_err(host_error)?;
    let sha = hex::encode(Sha256::digest(bytes.as_slice()));
    let mut tx = state.db.begin().await?;
    sqlx::query("INSERT INTO plugin_blobs (sha256, bytes, size_bytes) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
        .bind(&sha)
        .bind(bytes.as_ref())
        .bind(i64::try_from(bytes.len()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
    let (plugin_id,): (Uuid,) = sqlx::query_as(
        "INSERT INTO plugins (id, name) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
    )
    .bind(Uuid::new_v4())
    .bind(&name)
    .fetch_one(&mut *tx)
    .await?;
    let existing: Option<(String,)> =
        sqlx::query_as("SELECT sha256 FROM plugin_versions WHERE plugin_id = $1 AND version = $2")
            .bind(plugin_id)
            .bind(&version)
            .fetch_optional(&mut *tx)
            .await?;
    let status = match existing {
        Some((stored,)) if stored == sha => StatusCode::OK,
        Some(_) => {
            return Err(ApiError::Conflict(format!(
                "{name} {version} already exists with other bytes; upload a new version"
            )));
        }
        None => {
            sqlx::query(
                "INSERT INTO plugin_versions (id, plugin_id, version, sha256, uploaded_by, contract, description)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
                .bind(Uuid::new_v4())
                .bind(plugin_id)
                .bind(&version)
                .bind(&sha)
                .bind(caller.actor())
                .bind(&info.contract)
                .bind(&info.plugin.description)
                .execute(&mut *tx)
                .await?;
            db::audit(&mut *tx, &caller.actor(), "plugin.upload", &format!("plugin:{name}@{version}"),
                serde_json::json!({"sha256": sha, "size_bytes": bytes.len(), "reports_name": info.plugin.name,
                    "reports_version": info.plugin.version, "imports": info.imports})).await?;
            StatusCode::CREATED
        }
    };
    let row: VersionRow = sqlx::query_as(&format!(
        "{VERSION_SELECT} WHERE v.plugin_id = $1 AND v.version = $2"
    ))
    .bind(plugin_id)
    .bind(&version)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((status, Json(row.into())))
}

#[utoipa::path(get, path = "/api/v1/plugins", operation_id = "list_plugins", tag = "plugins", security(("bearer" = [])), responses((status = 200, body = [Plugin])))]
pub async fn list(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<Vec<Plugin>>> {
    caller.require(Role::Viewer)?;
    let rows: Vec<PluginRow> = sqlx::query_as(&format!("{PLUGIN_SELECT} ORDER BY p.name"))
        .fetch_all(&state.db)
        .await?;
    Ok(Json(rows.into_iter().map(Into::into).collect()))
}

async fn plugin_id(db: &sqlx::PgPool, name: &str) -> ApiResult<Uuid> {
    let row: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM plugins WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await?;
    row.map(|r| r.0)
        .ok_or_else(|| ApiError::NotFound(format!("no plugin named {name:?}")))
}

#[utoipa::path(get, path = "/api/v1/plugins/{name}/versions", tag = "plugins", security(("bearer" = [])),
    params(("name" = String, Path)), responses((status = 200, body = [PluginVersion]), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn versions(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Vec<PluginVersion>>> {
    caller.require(Role::Viewer)?;
    let id = plugin_id(&state.db, &name).await?;
    let rows: Vec<VersionRow> = sqlx::query_as(&format!(
        "{VERSION_SELECT} WHERE v.plugin_id = $1 ORDER BY v.created_at DESC"
    ))
    .bind(id)
    .fetch_all(&state.db)
    .await?;
    Ok(Json(rows.into_iter().map(Into::into).collect()))
}

/// The component bytes of one version.
#[utoipa::path(get, path = "/api/v1/plugins/{name}/versions/{version}/wasm", tag = "plugins", security(("bearer" = [])),
    params(("name" = String, Path), ("version" = String, Path)),
    responses((status = 200, content_type = "application/wasm", body = Vec<u8>), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn download(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    caller.require(Role::Viewer)?;
    let row: Option<(Vec<u8>,)> = sqlx::query_as(
        "SELECT b.bytes FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id JOIN plugin_blobs b ON b.sha256 = v.sha256
         WHERE p.name = $1 AND v.version = $2",
    )
    .bind(&name)
    .bind(&version)
    .fetch_optional(&state.db)
    .await?;
    let (bytes,) = row
        .ok_or_else(|| ApiError::NotFound(format!("no version {version:?} of plugin {name:?}")))?;
    Ok(([(header::CONTENT_TYPE, "application/wasm")], bytes))
}

/// Enable a plugin at a version (the newest when none is given). Enabling an older
/// version is how a rollback is done.
#[utoipa::path(post, path = "/api/v1/plugins/{name}/enable", tag = "plugins", security(("bearer" = [])),
    params(("name" = String, Path)), request_body = PluginEnable,
    responses((status = 200, body = Plugin), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn enable(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    Json(req): Json<PluginEnable>,
) -> ApiResult<Json<Plugin>> {
    caller.require(Role::Admin)?;
    let id = plugin_id(&state.db, &name).await?;
    let mut tx = state.db.begin().await?;
    let version: Option<(Uuid, String)> = match &req.version {
        Some(v) => sqlx::query_as("SELECT id, version FROM plugin_versions WHERE plugin_id = $1 AND version = $2")
            .bind(id)
            .bind(v)
            .fetch_optional(&mut *tx)
            .await?,
        None => sqlx::query_as("SELECT id, version FROM plugin_versions WHERE plugin_id = $1 ORDER BY created_at DESC LIMIT 1")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?,
    };
    let (version_id, version) = version.ok_or_else(|| {
        ApiError::NotFound(format!(
            "plugin {name:?} has no version {}",
            req.version.as_deref().unwrap_or("at all")
        ))
    })?;
    sqlx::query("UPDATE plugins SET enabled = true, active_version_id = $2 WHERE id = $1")
        .bind(id)
        .bind(version_id)
        .execute(&mut *tx)
        .await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "plugin.enable",
        &format!("plugin:{name}@{version}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    state.plugins.wake.notify_one();
    let row: PluginRow = sqlx::query_as(&format!("{PLUGIN_SELECT} WHERE p.id = $1"))
        .bind(id)
        .fetch_one(&state.db)
        .await?;
    Ok(Json(row.into()))
}

#[utoipa::path(post, path = "/api/v1/plugins/{name}/disable", tag = "plugins", security(("bearer" = [])),
    params(("name" = String, Path)), responses((status = 200, body = Plugin), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn disable(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Plugin>> {
    caller.require(Role::Admin)?;
    let id = plugin_id(&state.db, &name).await?;
    let mut tx = state.db.begin().await?;
    sqlx::query("UPDATE plugins SET enabled = false WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    db::audit(
        &mut *tx,
        &caller.actor(),
        "plugin.disable",
        &format!("plugin:{name}"),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    state.plugins.wake.notify_one();
    let row: PluginRow = sqlx::query_as(&format!("{PLUGIN_SELECT} WHERE p.id = $1"))
        .bind(id)
        .fetch_one(&state.db)
        .await?;
    Ok(Json(row.into()))
}

/// A plugin's failure is the uploader's problem (422); the host's own failure is ours (500).
fn host_error(err: heddle_plugin_host::HostError) -> ApiError {
    if err.is_plugin_fault() {
        ApiError::Unprocessable(format!("{err} [{}]", err.code()))
    } else {
        ApiError::Internal(anyhow::anyhow!("plugin host: {err}"))
    }
}

/// Run a version against the latest facts of every node (or the listed ones) without
/// enabling it: per node its output, the difference from what is active now, and the fuel,
/// time and memory it used.
#[utoipa::path(post, path = "/api/v1/plugins/{name}/versions/{version}/dry-run", tag = "plugins", security(("bearer" = [])),
    params(("name" = String, Path), ("version" = String, Path)), request_body = DryRunRequest,
    responses((status = 200, body = DryRunReport), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn dry_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
    Json(req): Json<DryRunRequest>,
) -> ApiResult<Json<DryRunReport>> {
    caller.require(Role::Operator)?;
    let row: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT p.id, v.sha256 FROM plugin_versions v JOIN plugins p ON p.id = v.plugin_id WHERE p.name = $1 AND v.version = $2",
    )
    .bind(&name)
    .bind(&version)
    .fetch_optional(&state.db)
    .await?;
    let (plugin_id, sha) = row
        .ok_or_else(|| ApiError::NotFound(format!("no version {version:?} of plugin {name:?}")))?;
    let node_ids: Option<Vec<Uuid>> = match &req.nodes {
        Some(keys) => {
            let mut ids = Vec::with_capacity(keys.len());
            for k in keys {
                ids.push(db::resolve_node(&state.db, k).await?);
            }
            Some(ids)
        }
        None => None,
    };
    let limit = i64::from(req.limit.unwrap_or(500).clamp(1, 5000));
    let subjects =
        outcomes::dry_run_subjects(&state.db, plugin_id, node_ids.as_deref(), limit).await?;
    let loaded = state
        .plugins
        .plugin(&state.db, &sha)
        .await?
        .map_err(host_error)?;
    let mut checked = Vec::with_capacity(subjects.len());
    for s in &subjects {
        checked
            .push(heddle_plugin_host::FactsJson::from_value(s.facts.clone()).map_err(host_error)?);
    }
    let results = state.plugins.evaluate(vec![loaded], checked).await;
    let mut out = Vec::with_capacity(subjects.len());
    for (s, mut ran) in subjects.into_iter().zip(results) {
        let result = ran
            .pop()
            .unwrap_or_else(|| Err(heddle_plugin_host::HostError::Internal("no outcome".into())));
        let usage = outcomes::usage_json(&result);
        let (output, error) = match result {
            Ok(r) => (Some(r.detection), None),
            Err(e) => (None, Some(outcomes::error_text(&e))),
        };
        let diff = OutputDiff::between(s.active.as_ref(), output.as_ref());
        out.push(DryRunNode {
            node_id: s.node_id,
            hostname: s.hostname,
            output,
            error,
            active_version: s.active_version,
            diff,
            usage,
        });
    }
    let changed = out
        .iter()
        .filter(|n| n.diff != OutputDiff::default())
        .count();
    let failed = out.iter().filter(|n| n.error.is_some()).count();
    Ok(Json(DryRunReport {
        plugin: name,
        version,
        nodes: out,
        changed,
        failed,
    }))
}

/// What each enabled plugin said about a node, with the resources it used.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/plugins", tag = "plugins", security(("bearer" = [])),
    params(("node" = String, Path)), responses((status = 200, body = [PluginOutcome]), (status = 404, body = heddle_types::ErrorBody)))]
pub async fn node_outcomes(
    State(state): State<AppState>,
    caller: Caller,
    Path(key): Path<String>,
) -> ApiResult<Json<Vec<PluginOutcome>>> {
    caller.require(Role::Viewer)?;
    let node = db::resolve_node(&state.db, &key).await?;
    Ok(Json(outcomes::for_node(&state.db, node).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_header_is_required() {
        let mut component = COMPONENT_HEADER.to_vec();
        component.extend_from_slice(&[0; 16]);
        assert!(check_component_bytes(&component, 1024).is_ok());
        assert!(matches!(
            check_component_bytes(&component, 8),
            Err(ApiError::PayloadTooLarge(_))
        ));
        assert!(matches!(
            check_component_bytes(b"hello world", 1024),
            Err(ApiError::Unprocessable(_))
        ));
        let core = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
        let err = check_component_bytes(&core, 1024).unwrap_err().to_string();
        assert!(err.contains("core WebAssembly module"), "{err}");
    }
}
