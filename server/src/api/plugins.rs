//! Plugin storage: content-addressed component blobs, named versions, enable/disable and
//! rollback (enable an older version).

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use heddle_types::auth::Role;
use heddle_types::plugins::*;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::db;
use crate::http::auth::Caller;
use crate::http::error::{ApiError, ApiResult, Json, Path};
use crate::plugins::{outcomes, store};
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
    store::insert_blob(&mut tx, &sha, &bytes).await?;
    let plugin_id = store::upsert_plugin(&mut tx, &name).await?;
    let status = match store::version_sha256(&mut tx, plugin_id, &version).await? {
        Some(stored) if stored == sha => StatusCode::OK,
        Some(_) => {
            return Err(ApiError::Conflict(format!(
                "{name} {version} already exists with other bytes; upload a new version"
            )));
        }
        None => {
            let new = store::NewVersion {
                plugin_id,
                version: &version,
                sha256: &sha,
                uploaded_by: &caller.actor(),
                contract: Some(&info.contract),
                description: Some(&info.plugin.description),
            };
            store::insert_version(&mut tx, &new).await?;
            db::audit(&mut *tx, &caller.actor(), "plugin.upload", &format!("plugin:{name}@{version}"),
                serde_json::json!({"sha256": sha, "size_bytes": bytes.len(), "reports_name": info.plugin.name,
                    "reports_version": info.plugin.version, "imports": info.imports})).await?;
            StatusCode::CREATED
        }
    };
    let stored = store::version(&mut tx, plugin_id, &version).await?;
    tx.commit().await?;
    Ok((status, Json(stored)))
}

#[utoipa::path(get, path = "/api/v1/plugins", operation_id = "list_plugins", tag = "plugins", security(("bearer" = [])), responses((status = 200, body = [Plugin])))]
pub async fn list(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<Vec<Plugin>>> {
    caller.require(Role::Viewer)?;
    Ok(Json(store::plugins(&state.db).await?))
}

async fn plugin_id(db: &sqlx::PgPool, name: &str) -> ApiResult<Uuid> {
    store::plugin_id(db, name)
        .await?
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
    Ok(Json(store::versions(&state.db, id).await?))
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
    let bytes = store::version_bytes(&state.db, &name, &version)
        .await?
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
    let picked = store::pick_version(&mut tx, id, req.version.as_deref()).await?;
    let (version_id, version) = picked.ok_or_else(|| {
        ApiError::NotFound(format!(
            "plugin {name:?} has no version {}",
            req.version.as_deref().unwrap_or("at all")
        ))
    })?;
    store::set_enabled(&mut tx, id, Some(version_id)).await?;
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
    Ok(Json(store::plugin(&state.db, id).await?))
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
    store::set_enabled(&mut tx, id, None).await?;
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
    Ok(Json(store::plugin(&state.db, id).await?))
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
    let found = store::find_version(&state.db, &name, &version).await?;
    let (plugin_id, sha) = found
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
