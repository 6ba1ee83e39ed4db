//! SQL shared by several modules: the audit log, name lookups, the readiness probe's ping.
//! Queries of one domain live in its module.

pub mod facts;
pub mod job_env_version;
pub mod plugins;
pub mod reachability;

use heddle_types::nodes::Liveness;
use sqlx::PgExecutor;
use uuid::Uuid;

/// Records a write. Called inside the write's transaction so the log and the change land
/// together or not at all.
/// A pool of one connection to the same database as `db`, opened when first used, for a
/// background task that must not queue behind requests for the shared pool (the
/// heartbeat flusher, the revocation feed).
pub fn side_connection(db: &sqlx::PgPool) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect_lazy_with((*db.connect_options()).clone())
}

pub async fn audit<'e>(
    db: impl PgExecutor<'e>,
    actor: &str,
    action: &str,
    target: &str,
    detail: serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO audit_log (actor, action, target, detail) VALUES ($1, $2, $3, $4)",
        actor,
        action,
        target,
        detail,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// One round trip to Postgres: it answers, and this pool can reach it (`/readyz`).
pub async fn ping(db: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    sqlx::query_scalar!("SELECT 1 AS ok").fetch_one(db).await?;
    Ok(())
}

/// The audit log's newest `limit` entries, only those whose action starts with `action`
/// when given.
pub async fn audit_entries(
    db: &sqlx::PgPool,
    action: Option<&str>,
    limit: i64,
) -> Result<Vec<heddle_types::auth::AuditEntry>, sqlx::Error> {
    sqlx::query_as!(
        heddle_types::auth::AuditEntry,
        "SELECT id, at, actor, action, target, detail FROM audit_log
         WHERE ($1::text IS NULL OR starts_with(action, $1)) ORDER BY id DESC LIMIT $2",
        action,
        limit,
    )
    .fetch_all(db)
    .await
}

/// A name or id that matches nothing; a domain error that each caller's error type maps
/// (to 404 in `http/error.rs`).
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no node with id or hostname {0:?}")]
    NoNode(String),
    #[error("no site named {0:?}")]
    NoSite(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Finds a node by id or hostname: the one place node names are resolved.
pub async fn resolve_node<'e>(db: impl PgExecutor<'e>, key: &str) -> Result<Uuid, LookupError> {
    let row = match Uuid::parse_str(key) {
        Ok(id) => {
            sqlx::query_scalar!("SELECT id FROM nodes WHERE id = $1", id)
                .fetch_optional(db)
                .await?
        }
        Err(_) => {
            sqlx::query_scalar!("SELECT id FROM nodes WHERE hostname = $1", key)
                .fetch_optional(db)
                .await?
        }
    };
    row.ok_or_else(|| LookupError::NoNode(key.to_string()))
}

pub async fn resolve_site<'e>(db: impl PgExecutor<'e>, name: &str) -> Result<Uuid, LookupError> {
    let row = sqlx::query_scalar!("SELECT id FROM sites WHERE name = $1", name)
        .fetch_optional(db)
        .await?;
    row.ok_or_else(|| LookupError::NoSite(name.to_string()))
}

/// A node is `online` while its last heartbeat is at most this many intervals old...
const ONLINE_WITHIN_HEARTBEATS: f64 = 2.5;
/// ...`stale` up to this many, `offline` after (or without any heartbeat).
const STALE_WITHIN_HEARTBEATS: f64 = 10.0;

/// `online`, `stale` or `offline` from the age of the last heartbeat.
pub fn liveness(
    last_seen: Option<chrono::DateTime<chrono::Utc>>,
    heartbeat: std::time::Duration,
) -> Liveness {
    let Some(seen) = last_seen else {
        return Liveness::Offline;
    };
    let age = (chrono::Utc::now() - seen).to_std().unwrap_or_default();
    if age <= heartbeat.mul_f64(ONLINE_WITHIN_HEARTBEATS) {
        Liveness::Online
    } else if age <= heartbeat.mul_f64(STALE_WITHIN_HEARTBEATS) {
        Liveness::Stale
    } else {
        Liveness::Offline
    }
}

/// The heartbeat ages in seconds up to which [`liveness`] says `online`, then `stale`.
pub fn liveness_thresholds(heartbeat: std::time::Duration) -> (f64, f64) {
    let hb = heartbeat.as_secs_f64();
    (hb * ONLINE_WITHIN_HEARTBEATS, hb * STALE_WITHIN_HEARTBEATS)
}

/// The heartbeat ages in seconds (at least, at most) that [`liveness`] calls `state`, for
/// filtering in SQL.
pub fn liveness_age_bounds(
    state: Liveness,
    heartbeat: std::time::Duration,
) -> (Option<f64>, Option<f64>) {
    let (online, stale) = liveness_thresholds(heartbeat);
    match state {
        Liveness::Online => (None, Some(online)),
        Liveness::Stale => (Some(online), Some(stale)),
        Liveness::Offline => (Some(stale), None),
    }
}

/// A name people typed (a site, token, plugin, profile) that [`check_name`] refuses; the
/// input is at fault (422 in `http/error.rs`).
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} {name:?} must be 1-64 characters of letters, digits, '-', '_' or '.', starting with a letter or digit"
)]
pub struct InvalidName {
    pub what: &'static str,
    pub name: String,
}

/// Names people type: sites, tokens, plugins.
pub fn check_name(what: &'static str, name: &str) -> Result<(), InvalidName> {
    if heddle_types::names::NAME.allows(name) {
        Ok(())
    } else {
        Err(InvalidName {
            what,
            name: name.to_string(),
        })
    }
}

/// Every name and value of a set of environment variables (a run's env, a tuning profile,
/// a sweep winner), and its size: the server's one check, which is
/// `heddle_types::env_policy`'s. `what` names the set in the size error.
pub fn check_env(
    env: &std::collections::BTreeMap<String, String>,
    what: &str,
) -> Result<(), heddle_types::env_policy::EnvError> {
    heddle_types::env_policy::check_env(env)?;
    heddle_types::env_policy::check_env_size(
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &format!("{what}: {}", env.len()),
    )
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
    fn liveness_bands() {
        let hb = std::time::Duration::from_secs(10);
        let now = chrono::Utc::now();
        assert_eq!(liveness(None, hb), Liveness::Offline);
        assert_eq!(liveness(Some(now), hb), Liveness::Online);
        assert_eq!(
            liveness(Some(now - chrono::Duration::seconds(40)), hb),
            Liveness::Stale
        );
        assert_eq!(
            liveness(Some(now - chrono::Duration::seconds(500)), hb),
            Liveness::Offline
        );
        assert_eq!(
            liveness_age_bounds(Liveness::Stale, hb),
            (Some(25.0), Some(100.0))
        );
    }
}
