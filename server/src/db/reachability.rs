//! What this replica last saw of Postgres: reachable, or unreachable since when and why.
//! Fed by the lease reaper's ticks and by `/readyz` probes; read by `/readyz` to say why
//! the replica is not ready. Only an observation of this replica, never shared state.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A stretch of time in which Postgres could not be reached.
#[derive(Debug, Clone, PartialEq)]
pub struct Outage {
    pub since: DateTime<Utc>,
    pub last_error: String,
}

#[derive(Debug, Default)]
pub struct Reachability {
    outage: Mutex<Option<Outage>>,
}

impl Reachability {
    /// A statement succeeded. Returns how long the outage it ends lasted, if one did.
    pub fn reached(&self) -> Option<Duration> {
        let ended = self.outage.lock().expect("reachability lock").take()?;
        let lasted = (Utc::now() - ended.since).to_std().unwrap_or_default();
        tracing::info!(down_for = ?lasted, since = %ended.since, "database reachable again");
        Some(lasted)
    }

    /// A statement failed. Only errors of the unreachable kind ([`db_unreachable`]) start or
    /// extend an outage; a wrong statement says nothing about reachability.
    pub fn failed(&self, err: &sqlx::Error) {
        if db_unreachable(err) {
            self.unreachable(err.to_string());
        }
    }

    /// No answer at all, e.g. a probe that timed out.
    pub fn unreachable(&self, why: String) {
        let mut outage = self.outage.lock().expect("reachability lock");
        match outage.as_mut() {
            Some(o) => o.last_error = why,
            None => {
                tracing::warn!(error = %why, "database unreachable");
                *outage = Some(Outage {
                    since: Utc::now(),
                    last_error: why,
                });
            }
        }
    }

    /// The outage in progress, as this replica saw it.
    pub fn outage(&self) -> Option<Outage> {
        self.outage.lock().expect("reachability lock").clone()
    }
}

/// Whether `err` says the database is out of reach rather than that the request or the
/// server is wrong: no connection (refused, reset, TLS, pool timeout or closed), or Postgres
/// refusing work while it shuts down, restarts or is full. The one place that decides
/// between 503 and 500 for database errors; `/readyz` and the lease reaper use it too.
pub fn db_unreachable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| unreachable_sqlstate(&code)),
        _ => false,
    }
}

/// SQLSTATEs that mean "this server cannot take work now", not "this statement is wrong":
/// class 08 (connection exception), 57P01 admin_shutdown (fast shutdown), 57P02
/// crash_shutdown, 57P03 cannot_connect_now (starting up, shutting down, recovering),
/// 53300 too_many_connections and 25006 read_only_sql_transaction (a standby promoted
/// too late, or a failover in progress).
fn unreachable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "25006")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_starts_once_keeps_its_start_and_ends_on_success() {
        let r = Reachability::default();
        assert_eq!(r.outage(), None);
        assert_eq!(r.reached(), None);
        r.failed(&sqlx::Error::PoolTimedOut);
        let first = r.outage().expect("an outage");
        assert!(first.last_error.contains("timed out"), "{first:?}");
        r.unreachable("connection refused".into());
        let later = r.outage().unwrap();
        assert_eq!(later.since, first.since);
        assert_eq!(later.last_error, "connection refused");
        assert!(r.reached().is_some());
        assert_eq!(r.outage(), None);
    }

    #[test]
    fn a_wrong_statement_is_no_outage() {
        let r = Reachability::default();
        r.failed(&sqlx::Error::RowNotFound);
        r.failed(&sqlx::Error::ColumnNotFound("x".into()));
        assert_eq!(r.outage(), None);
    }
}
