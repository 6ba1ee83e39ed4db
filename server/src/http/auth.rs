//! Bearer-token authentication for people (API tokens with roles) and agents (per-agent
//! credentials). Secrets are 256-bit random values; only their SHA-256 is stored.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use base64::Engine;
use heddle_types::auth::Role;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::state::AppState;

/// Prefixes make leaked secrets recognisable (and greppable by secret scanners).
pub const API_TOKEN_PREFIX: &str = "hdl_";
pub const ENROLL_TOKEN_PREFIX: &str = "hde_";
pub const AGENT_CREDENTIAL_PREFIX: &str = "hda_";

pub fn new_secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

pub fn sha256_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// The dashboard's session cookie: the API token, out of reach of the page's scripts
/// (HttpOnly) and never sent by another site's pages (SameSite=Strict).
pub const SESSION_COOKIE: &str = "heddle_session";

fn missing() -> ApiError {
    ApiError::Unauthorized("missing Authorization: Bearer <token> header".into())
}

/// The bearer token of `Authorization`, `None` when the header is absent.
fn bearer(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::Unauthorized("Authorization header is not valid text".into()))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(|| {
            ApiError::Unauthorized("Authorization header must be `Bearer <token>`".into())
        })?;
    Ok(Some(token.trim()))
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// The secret a request presents, bearer token first, then the session cookie; `None` for
/// none or a malformed header. For counting requests per credential, not for trusting it.
pub fn presented_token(headers: &HeaderMap) -> Option<&str> {
    match bearer(headers) {
        Ok(Some(t)) if !t.is_empty() => Some(t),
        Ok(_) => session_cookie(headers),
        Err(_) => None,
    }
}

/// `Set-Cookie` for a dashboard session holding `token`; `Secure` when the page was
/// loaded over HTTPS. `None` when the token has characters a cookie cannot hold.
pub fn session_set_cookie(token: &str, secure: bool) -> Option<HeaderValue> {
    let ok = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\'));
    if !ok {
        return None;
    }
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={token}; Path=/api; HttpOnly; SameSite=Strict{secure}"
    ))
    .ok()
}

/// `Set-Cookie` that ends a dashboard session.
pub fn session_clear_cookie() -> HeaderValue {
    HeaderValue::from_static("heddle_session=; Path=/api; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// A person or program holding an API token.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: Uuid,
    pub name: String,
    pub role: Role,
}

impl Caller {
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this needs the {role} role; token {:?} is {}",
                self.name, self.role
            )))
        }
    }

    /// How the caller appears in the audit log and `created_by` columns.
    pub fn actor(&self) -> String {
        format!("token:{}", self.name)
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = match bearer(&parts.headers)? {
            Some(t) => t,
            None => session_cookie(&parts.headers).ok_or_else(missing)?,
        };
        caller_for_token(state, token).await
    }
}

/// The caller an API token stands for, or why it is refused.
pub async fn caller_for_token(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    if token.starts_with(AGENT_CREDENTIAL_PREFIX) {
        return Err(ApiError::Forbidden(
            "agent credentials cannot use the operator API".into(),
        ));
    }
    let sha = sha256_hex(token);
    let row = sqlx::query!(
        r#"SELECT id, name, role,
                coalesce(last_used_at < now() - make_interval(secs => $2), true) AS "stale!"
         FROM api_tokens
         WHERE token_sha256 = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"#,
        sha,
        LAST_USED_RESOLUTION.as_secs_f64(),
    )
    .fetch_optional(&state.db)
    .await?;
    let Some((token_id, name, role, stale)) = row.map(|r| (r.id, r.name, r.role, r.stale)) else {
        return Err(refused_token(&state.db, &sha).await);
    };
    if stale {
        touch_token(&state.db, token_id).await?;
    }
    let role = role
        .parse()
        .map_err(|e: String| ApiError::Internal(anyhow::anyhow!(e)))?;
    Ok(Caller {
        token_id,
        name,
        role,
    })
}

/// How stale a token's `last_used_at` may get: it is written at most once per this long
/// (on all replicas together), so a busy token costs reads, not a write per request.
pub const LAST_USED_RESOLUTION: std::time::Duration = std::time::Duration::from_secs(60);

/// Sets a token's `last_used_at` unless another request (on any replica) did within
/// [`LAST_USED_RESOLUTION`]; the row lock makes racing requests write it once.
async fn touch_token(db: &sqlx::PgPool, token_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE api_tokens SET last_used_at = now()
         WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - make_interval(secs => $2))",
        token_id,
        LAST_USED_RESOLUTION.as_secs_f64(),
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Why a presented API token was refused, in words that say what to do.
async fn refused_token(db: &sqlx::PgPool, sha: &str) -> ApiError {
    let row = sqlx::query!(
        "SELECT name, revoked_at, expires_at FROM api_tokens WHERE token_sha256 = $1",
        sha,
    )
    .fetch_optional(db)
    .await
    .map(|r| r.map(|r| (r.name, r.revoked_at, r.expires_at)));
    match row {
        Err(e) => e.into(),
        Ok(None) => ApiError::Unauthorized(
            "unknown token; check HEDDLE_TOKEN or ask an admin for one (heddle tokens create)"
                .into(),
        ),
        Ok(Some((name, Some(at), _))) => ApiError::Unauthorized(format!(
            "token {name:?} was revoked at {at}; ask an admin for a new one"
        )),
        Ok(Some((name, None, Some(at)))) => ApiError::Unauthorized(format!(
            "token {name:?} expired at {at}; ask an admin for a new one"
        )),
        // Expired or revoked between the two queries.
        Ok(Some((name, None, None))) => {
            ApiError::Unauthorized(format!("token {name:?} is no longer valid"))
        }
    }
}

/// An enrolled, non-revoked agent.
#[derive(Debug, Clone, Copy)]
pub struct AgentCaller {
    pub agent_id: Uuid,
    pub node_id: Uuid,
}

impl FromRequestParts<AppState> for AgentCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(&parts.headers)?.ok_or_else(missing)?;
        let sha: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(known) = state.credentials.get(&sha) {
            return Ok(AgentCaller {
                agent_id: known.agent_id,
                node_id: known.node_id,
            });
        }
        // While this replica sees the database down, say so at once: a lookup would wait
        // out the pool's acquire timeout (5 s) first, and an agent whose heartbeat waits
        // that long is heard from that much later once the database is back.
        if let Some(o) = state.db_reach.outage() {
            return Err(ApiError::Unavailable(sqlx::Error::Io(
                std::io::Error::other(format!(
                    "database unreachable since {}: {}",
                    o.since, o.last_error
                )),
            )));
        }
        let looked_up_at = std::time::Instant::now();
        let row = sqlx::query!(
            r#"SELECT id, node_id, revoked_at IS NOT NULL AS "revoked!"
             FROM agents WHERE credential_sha256 = $1"#,
            hex::encode(sha),
        )
        .fetch_optional(
            &mut *state
                .metrics
                .pools
                .acquire("agent", &state.agent_db)
                .await?,
        )
        .await?;
        match row.map(|r| (r.id, r.node_id, r.revoked)) {
            None => Err(ApiError::Unauthorized(
                "unknown agent credential; enroll again".into(),
            )),
            Some((_, _, true)) => Err(ApiError::Unauthorized("this agent has been revoked".into())),
            Some((agent_id, node_id, false)) => {
                let known = crate::credentials::Cached { agent_id, node_id };
                state.credentials.insert(sha, known, looked_up_at);
                Ok(AgentCaller { agent_id, node_id })
            }
        }
    }
}

/// Name of the admin token that `HEDDLE_ADMIN_TOKEN` configures.
const CONFIGURED_ADMIN: &str = "admin-from-config";

/// Creates the first admin token: the configured one, or a random one that is printed.
///
/// A configured token is the admin token while it is configured: when `HEDDLE_ADMIN_TOKEN`
/// changes, the token configured before is revoked at start-up and the new one works. The
/// replicas take a lock, so several may start at once; give them all the same value, or
/// the last to start wins.
pub async fn bootstrap_admin(
    db: &sqlx::PgPool,
    configured: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let mut tx = db.begin().await?;
    sqlx::query_scalar!(r#"SELECT pg_advisory_xact_lock(727275)::text AS "locked?""#)
        .fetch_one(&mut *tx)
        .await?;
    let Some(configured) = configured else {
        let any = sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM api_tokens) AS "any!""#)
            .fetch_one(&mut *tx)
            .await?;
        if any {
            return Ok(None);
        }
        let token = new_secret(API_TOKEN_PREFIX);
        sqlx::query!(
            "INSERT INTO api_tokens (id, name, role, token_sha256) VALUES ($1, 'bootstrap-admin', 'admin', $2)",
            Uuid::new_v4(),
            sha256_hex(&token),
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        return Ok(Some(token));
    };
    let sha = sha256_hex(configured);
    // The previous configured token keeps its row (and audit trail) under another name.
    let rotated = sqlx::query_scalar!(
        "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()), name = $1 || '-revoked-' || id
         WHERE name = $1 AND token_sha256 <> $2 RETURNING id",
        CONFIGURED_ADMIN,
        sha,
    )
    .fetch_all(&mut *tx)
    .await?;
    // Configuring another token's value (rotating back, promoting a token) makes it the live
    // admin token: whoever sets the server's environment decides who is admin. The token
    // configured now keeps a revocation made through the API until the value changes.
    sqlx::query!(
        "INSERT INTO api_tokens (id, name, role, token_sha256) VALUES ($1, $2, 'admin', $3)
         ON CONFLICT (token_sha256) DO UPDATE SET name = EXCLUDED.name, role = 'admin',
             revoked_at = NULL, expires_at = NULL
         WHERE api_tokens.name <> EXCLUDED.name",
        Uuid::new_v4(),
        CONFIGURED_ADMIN,
        sha,
    )
    .execute(&mut *tx)
    .await?;
    if !rotated.is_empty() {
        crate::db::audit(
            &mut *tx,
            "server:start",
            "token.rotate_configured_admin",
            &format!("token:{CONFIGURED_ADMIN}"),
            serde_json::json!({"revoked": rotated}),
        )
        .await?;
        tracing::warn!(
            revoked = rotated.len(),
            "HEDDLE_ADMIN_TOKEN changed: the previously configured admin token is revoked"
        );
    }
    tx.commit().await?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_prefixed_unique_and_long() {
        let a = new_secret(API_TOKEN_PREFIX);
        let b = new_secret(API_TOKEN_PREFIX);
        assert!(a.starts_with("hdl_"));
        assert_ne!(a, b);
        // 32 bytes in unpadded base64 are 43 characters.
        assert_eq!(a.len(), 4 + 43);
        assert_eq!(sha256_hex(&a).len(), 64);
        assert_ne!(sha256_hex(&a), sha256_hex(&b));
    }

    #[test]
    fn roles_are_ordered() {
        let caller = Caller {
            token_id: Uuid::nil(),
            name: "t".into(),
            role: Role::Operator,
        };
        assert!(caller.require(Role::Viewer).is_ok());
        assert!(caller.require(Role::Operator).is_ok());
        assert!(matches!(
            caller.require(Role::Admin),
            Err(ApiError::Forbidden(_))
        ));
    }
}
