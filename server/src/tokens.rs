//! API tokens and enrollment tokens as stored (`api_tokens`, `enrollment_tokens`): created
//! with their secret's hash (the secret itself is the caller's to hand out once), listed
//! without it, revoked. Changes run in the caller's transaction, beside its audit entry.
//! Never sees HTTP: its errors are `sqlx::Error` and [`TokenError`]; a duplicate name is
//! the caller's to say.

use chrono::{DateTime, Utc};
use heddle_types::auth::{EnrollmentTokenInfo, Role, TokenInfo};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// What reading tokens can fail with; mapped to HTTP in `http/error.rs`.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// A stored row that this server cannot read (a role it does not know).
    #[error("stored token {id} has role {role:?}, which is not a role")]
    Corrupt { id: Uuid, role: String },
}

/// A new API token: its name, role, the SHA-256 of its secret and when it expires.
pub struct NewApiToken<'a> {
    pub name: &'a str,
    pub role: Role,
    pub secret_sha256: &'a str,
    pub expires_at: Option<DateTime<Utc>>,
}

pub async fn insert_api_token(
    tx: &mut PgConnection,
    new: &NewApiToken<'_>,
) -> Result<TokenInfo, sqlx::Error> {
    let r = sqlx::query!(
        "INSERT INTO api_tokens (id, name, role, token_sha256, expires_at) VALUES ($1, $2, $3, $4, $5)
         RETURNING id, name, created_at, expires_at, revoked_at, last_used_at",
        Uuid::new_v4(),
        new.name,
        new.role.as_str(),
        new.secret_sha256,
        new.expires_at,
    )
    .fetch_one(tx)
    .await?;
    Ok(TokenInfo {
        id: r.id,
        name: r.name,
        role: new.role,
        created_at: r.created_at,
        expires_at: r.expires_at,
        revoked_at: r.revoked_at,
        last_used_at: r.last_used_at,
    })
}

/// Every API token, oldest first.
pub async fn api_tokens(db: &PgPool) -> Result<Vec<TokenInfo>, TokenError> {
    let rows = sqlx::query!(
        "SELECT id, name, role, created_at, expires_at, revoked_at, last_used_at
         FROM api_tokens ORDER BY created_at"
    )
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|r| {
            let role = r.role.parse().map_err(|_| TokenError::Corrupt {
                id: r.id,
                role: r.role.clone(),
            })?;
            Ok(TokenInfo {
                id: r.id,
                name: r.name,
                role,
                created_at: r.created_at,
                expires_at: r.expires_at,
                revoked_at: r.revoked_at,
                last_used_at: r.last_used_at,
            })
        })
        .collect()
}

/// Revokes API token `id` (once: a second revocation keeps the first time). Returns its
/// name, or `None` when there is no such token.
pub async fn revoke_api_token(
    tx: &mut PgConnection,
    id: Uuid,
) -> Result<Option<String>, sqlx::Error> {
    let r = sqlx::query_scalar!(
        "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 RETURNING name",
        id
    )
    .fetch_optional(tx)
    .await?;
    Ok(r)
}

/// A new enrollment token, checked by the caller.
pub struct NewEnrollmentToken<'a> {
    pub name: Option<&'a str>,
    pub secret_sha256: &'a str,
    pub max_uses: i32,
    pub created_by: &'a str,
    pub expires_in_hours: i32,
    /// The one host name it enrolls, when bound to a node.
    pub node: Option<&'a str>,
}

pub async fn insert_enrollment_token(
    tx: &mut PgConnection,
    new: &NewEnrollmentToken<'_>,
) -> Result<EnrollmentTokenInfo, sqlx::Error> {
    sqlx::query_as!(
        EnrollmentTokenInfo,
        "INSERT INTO enrollment_tokens (id, name, token_sha256, max_uses, created_by, expires_at, node)
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(hours => $6), $7)
         RETURNING id, name, max_uses, uses, created_at, expires_at, revoked_at, node",
        Uuid::new_v4(),
        new.name,
        new.secret_sha256,
        new.max_uses,
        new.created_by,
        new.expires_in_hours,
        new.node,
    )
    .fetch_one(tx)
    .await
}

/// Every enrollment token, oldest first.
pub async fn enrollment_tokens(db: &PgPool) -> Result<Vec<EnrollmentTokenInfo>, sqlx::Error> {
    sqlx::query_as!(
        EnrollmentTokenInfo,
        "SELECT id, name, max_uses, uses, created_at, expires_at, revoked_at, node
         FROM enrollment_tokens ORDER BY created_at"
    )
    .fetch_all(db)
    .await
}

/// Revokes enrollment token `id` (once); `false` when there is no such token.
pub async fn revoke_enrollment_token(tx: &mut PgConnection, id: Uuid) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE enrollment_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1",
        id
    )
    .execute(tx)
    .await?;
    Ok(done.rows_affected() > 0)
}
