//! SQL shared by several handlers. Queries used by one handler live beside it in `api/`.

pub mod facts;

use sqlx::PgExecutor;
use uuid::Uuid;

use crate::error::ApiError;

/// Records a write. Called inside the write's transaction so the log and the change land
/// together or not at all.
pub async fn audit<'e>(
    db: impl PgExecutor<'e>,
    actor: &str,
    action: &str,
    target: &str,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO audit_log (actor, action, target, detail) VALUES ($1, $2, $3, $4)")
        .bind(actor)
        .bind(action)
        .bind(target)
        .bind(detail)
        .execute(db)
        .await?;
    Ok(())
}

/// Finds a node by id or hostname.
pub async fn resolve_node<'e>(db: impl PgExecutor<'e>, key: &str) -> Result<Uuid, ApiError> {
    let row: Option<(Uuid,)> = match Uuid::parse_str(key) {
        Ok(id) => {
            sqlx::query_as("SELECT id FROM nodes WHERE id = $1")
                .bind(id)
                .fetch_optional(db)
                .await?
        }
        Err(_) => {
            sqlx::query_as("SELECT id FROM nodes WHERE hostname = $1")
                .bind(key)
                .fetch_optional(db)
                .await?
        }
    };
    row.map(|r| r.0)
        .ok_or_else(|| ApiError::NotFound(format!("no node with id or hostname {key:?}")))
}

pub async fn resolve_site<'e>(db: impl PgExecutor<'e>, name: &str) -> Result<Uuid, ApiError> {
    let row: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM sites WHERE name = $1")
        .bind(name)
        .fetch_optional(db)
        .await?;
    row.map(|r| r.0)
        .ok_or_else(|| ApiError::NotFound(format!("no site named {name:?}")))
}

/// `online`, `stale` or `offline` from the age of the last heartbeat.
pub fn health(
    last_seen: Option<chrono::DateTime<chrono::Utc>>,
    heartbeat: std::time::Duration,
) -> &'static str {
    let Some(seen) = last_seen else {
        return "offline";
    };
    let age = (chrono::Utc::now() - seen).to_std().unwrap_or_default();
    if age <= heartbeat * 5 / 2 {
        "online"
    } else if age <= heartbeat * 10 {
        "stale"
    } else {
        "offline"
    }
}

/// Names people type: sites, tokens, plugins.
pub fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "{what} {name:?} must be 1-64 characters of letters, digits, '-', '_' or '.', starting with a letter or digit"
        )))
    }
}

/// Every name and value of a set of environment variables (a run's env, a tuning profile,
/// a sweep winner): the server's one check, which is `heddle_types::env_policy`'s.
pub fn check_env(env: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    Ok(heddle_types::env_policy::check_env(env)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("site", "rack-1.a_b").is_ok());
        assert!(check_name("site", "").is_err());
        assert!(check_name("site", "-x").is_err());
        assert!(check_name("site", "a b").is_err());
        assert!(check_name("site", &"a".repeat(65)).is_err());
    }

    #[test]
    fn health_bands() {
        let hb = std::time::Duration::from_secs(10);
        let now = chrono::Utc::now();
        assert_eq!(health(None, hb), "offline");
        assert_eq!(health(Some(now), hb), "online");
        assert_eq!(
            health(Some(now - chrono::Duration::seconds(40)), hb),
            "stale"
        );
        assert_eq!(
            health(Some(now - chrono::Duration::seconds(500)), hb),
            "offline"
        );
    }
}
