//! Bearer-token authentication for people (API tokens with roles) and agents (per-agent
//! credentials). Secrets are 256-bit random values; only their SHA-256 is stored.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use base64::Engine;
use heddle_types::auth::Role;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::AppState;
use crate::error::ApiError;

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

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let value = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| {
            ApiError::Unauthorized("missing Authorization: Bearer <token> header".into())
        })?;
    let value = value
        .to_str()
        .map_err(|_| ApiError::Unauthorized("Authorization header is not valid text".into()))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(|| {
            ApiError::Unauthorized("Authorization header must be `Bearer <token>`".into())
        })?;
    Ok(token.trim())
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
        let token = bearer(parts)?;
        if token.starts_with(AGENT_CREDENTIAL_PREFIX) {
            return Err(ApiError::Forbidden(
                "agent credentials cannot use the operator API".into(),
            ));
        }
        let row: Option<(Uuid, String, String)> = sqlx::query_as(
            "UPDATE api_tokens SET last_used_at = now()
             WHERE token_sha256 = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
             RETURNING id, name, role",
        )
        .bind(sha256_hex(token))
        .fetch_optional(&state.db)
        .await?;
        let (token_id, name, role) =
            row.ok_or_else(|| ApiError::Unauthorized("unknown, revoked or expired token".into()))?;
        let role = role
            .parse()
            .map_err(|e: String| ApiError::Internal(anyhow::anyhow!(e)))?;
        Ok(Caller {
            token_id,
            name,
            role,
        })
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
        let token = bearer(parts)?;
        let row: Option<(Uuid, Uuid, bool)> = sqlx::query_as(
            "SELECT id, node_id, revoked_at IS NOT NULL FROM agents WHERE credential_sha256 = $1",
        )
        .bind(sha256_hex(token))
        .fetch_optional(&state.db)
        .await?;
        match row {
            None => Err(ApiError::Unauthorized(
                "unknown agent credential; enroll again".into(),
            )),
            Some((_, _, true)) => Err(ApiError::Unauthorized("this agent has been revoked".into())),
            Some((agent_id, node_id, false)) => Ok(AgentCaller { agent_id, node_id }),
        }
    }
}

/// Creates the first admin token: the configured one, or a random one that is printed.
/// Safe to run on several replicas at once: only the replica that inserts it prints it.
pub async fn bootstrap_admin(
    db: &sqlx::PgPool,
    configured: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let (token, name) = match configured {
        Some(t) => (t.to_string(), "admin-from-config"),
        None => {
            let any: (bool,) = sqlx::query_as("SELECT EXISTS (SELECT 1 FROM api_tokens)")
                .fetch_one(db)
                .await?;
            if any.0 {
                return Ok(None);
            }
            (new_secret(API_TOKEN_PREFIX), "bootstrap-admin")
        }
    };
    let inserted = sqlx::query(
        "INSERT INTO api_tokens (id, name, role, token_sha256) VALUES ($1, $2, 'admin', $3)
         ON CONFLICT DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(name)
    .bind(sha256_hex(&token))
    .execute(db)
    .await?
    .rows_affected();
    Ok((inserted == 1 && configured.is_none()).then_some(token))
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
