//! Uses of an enrollment token, taken from its row — in blocks when it has many left.
//!
//! A fleet enrolls with one token: 50,000 enrollments each taking a use one at a time all
//! queue on that one row. So while a token that is bound to no node has at least
//! [`BLOCK_FROM`] uses left, a replica takes [`BLOCK`] of them in one statement and hands
//! them to its next enrollments with that token. Uses a replica holds for longer than
//! [`HOLD`] go back to the row, so two replicas enrolling the last few agents of a token
//! never starve each other, and a token revoked or expiring stops being honoured from a
//! held block within that time; an enrollment that finds the row empty while uses may be
//! held waits for them (up to [`WAIT_FOR_HELD`]) before calling the token used up. A
//! replica goes to a token's row for one enrollment at a time: the others that find no use
//! held wait for the block it brings back rather than each queueing on the row's lock (with
//! two replicas enrolling 50,000 agents on two cores, 42 backends waited on that lock on
//! average). A token with fewer uses left is taken one use at a time, exactly as counted. Nothing can be over-used: a use is counted before it is handed out;
//! a replica that dies holding a block leaves at most that block counted and unused.
//! `workers/token_returns.rs` gives back what is held past [`HOLD`], and all of it when the
//! server stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// Uses taken at once from a token with at least [`BLOCK_FROM`] left.
pub const BLOCK: i32 = 64;
/// Below this many uses left, a token is taken one use at a time.
pub const BLOCK_FROM: i32 = 256;
/// How long a replica keeps uses it took and has not handed out.
pub const HOLD: Duration = Duration::from_secs(1);
/// How long an enrollment waits for another's trip to its token's row before going to the
/// row itself.
const GATE_WAIT: Duration = Duration::from_secs(10);

/// A use of an enrollment token taken for one enrollment: the token's id and the node it
/// is bound to, if any.
pub struct TakenUse {
    pub id: Uuid,
    pub node: Option<String>,
}

struct Block {
    id: Uuid,
    left: i32,
    taken_at: Instant,
    expires_at: DateTime<Utc>,
}

/// The blocks of uses this replica holds, by the token's SHA-256.
#[derive(Default)]
pub struct TokenUses {
    inner: Mutex<Inner>,
    /// Trips to a row that took uses (for tests).
    row_trips: AtomicU64,
}

#[derive(Default)]
struct Inner {
    held: HashMap<String, Block>,
    /// Uses whose return to their row failed: tried again, never dropped, so a failed
    /// return cannot use a token up.
    failed: Vec<(Uuid, i32)>,
    /// Trips to the rows under way (taking a block, or returning uses): while any is,
    /// uses may be neither in a row nor held, so "none left" is not yet final.
    in_flight: usize,
    /// One gate per token that enrollments are taking from its row: the one holding it
    /// goes to the row, the others wait and then take from what it brought.
    gates: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

/// A token's gate, dropped from the map by its last user.
struct Gate<'a> {
    uses: &'a TokenUses,
    sha: &'a str,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        let mut inner = self.uses.lock();
        // The map's reference and this one: nobody else waits.
        if Arc::strong_count(&self.gate) <= 2 {
            inner.gates.remove(self.sha);
        }
    }
}

/// Marks a trip to the rows under way for as long as it lives.
struct Trip<'a>(&'a TokenUses);

impl Drop for Trip<'_> {
    fn drop(&mut self) {
        self.0.lock().in_flight -= 1;
    }
}

impl TokenUses {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn trip(&self) -> Trip<'_> {
        self.lock().in_flight += 1;
        Trip(self)
    }

    /// One held use of the token, if this replica holds a fresh one.
    fn take_held(&self, sha: &str) -> Option<TakenUse> {
        let mut inner = self.lock();
        let block = inner.held.get_mut(sha)?;
        if block.left == 0 || block.taken_at.elapsed() > HOLD || block.expires_at <= Utc::now() {
            return None;
        }
        block.left -= 1;
        Some(TakenUse {
            id: block.id,
            node: None,
        })
    }

    fn hold(&self, sha: String, id: Uuid, left: i32, expires_at: DateTime<Utc>) {
        let mut inner = self.lock();
        let block = inner.held.entry(sha).or_insert(Block {
            id,
            left: 0,
            taken_at: Instant::now(),
            expires_at,
        });
        block.left += left;
        block.taken_at = Instant::now();
    }

    /// Takes out what is due back to the rows: the blocks held past [`HOLD`] (all of them
    /// with `all`), or only `sha`'s whatever its age, and every failed return; the trip
    /// that returns them is counted from here.
    fn due(&self, all: bool, sha: Option<&str>) -> (Vec<(Uuid, i32)>, Trip<'_>) {
        let mut inner = self.lock();
        let mut back = std::mem::take(&mut inner.failed);
        inner.held.retain(|token, b| {
            let keep = match sha {
                Some(sha) => token != sha,
                None => !all && b.taken_at.elapsed() <= HOLD,
            };
            if !keep && b.left > 0 {
                back.push((b.id, b.left));
            }
            keep
        });
        inner.in_flight += 1;
        (back, Trip(self))
    }

    /// Uses held, over every token (for tests and metrics).
    pub fn held(&self) -> i32 {
        self.lock().held.values().map(|b| b.left).sum()
    }

    /// Trips to a token's row that took uses, since the start (for tests).
    pub fn row_trips(&self) -> u64 {
        self.row_trips.load(Ordering::Relaxed)
    }

    fn gate<'a>(&'a self, sha: &'a str) -> Gate<'a> {
        let gate = self
            .lock()
            .gates
            .entry(sha.to_string())
            .or_default()
            .clone();
        Gate {
            uses: self,
            sha,
            gate,
        }
    }
}

/// Takes one use of the token for `hostname`: from a block this replica holds, else from
/// the row (a block of them when the token allows). `None` when the row had none to give:
/// the caller says why. The row's use is taken in a transaction of its own, committed
/// without waiting for the WAL flush: the enrollment's own (synchronous) commit comes
/// later in the WAL, so a credential that survives a crash has its use counted too.
pub async fn take(
    db: &PgPool,
    held: &TokenUses,
    sha: &str,
    hostname: &str,
) -> sqlx::Result<Option<TakenUse>> {
    if let Some(taken) = held.take_held(sha) {
        return Ok(Some(taken));
    }
    {
        let gate = held.gate(sha);
        // A trip that takes longer than GATE_WAIT (the row locked by something else) does
        // not hold the others forever: past it they go to the row themselves.
        let _through = tokio::time::timeout(GATE_WAIT, gate.gate.lock()).await;
        // What the enrollment ahead brought back.
        if let Some(taken) = held.take_held(sha) {
            return Ok(Some(taken));
        }
        if let Some(taken) = take_from_row(db, held, sha, hostname).await? {
            return Ok(Some(taken));
        }
    }
    // The row has none left, but uses may still come back to it: this replica's own held
    // past HOLD or on their way to or from the row, and, for a token taken in blocks,
    // another replica's block, which it gives back within 1.5 × HOLD of taking it. So the
    // row is asked again until that has had time to happen: a token used up for good is
    // refused after [`WAIT_FOR_HELD`] (blocks) or at once (a token never taken in blocks
    // and no trip of this replica under way).
    let elsewhere = maybe_held_elsewhere(db, sha).await?;
    let started = Instant::now();
    while started.elapsed() < WAIT_FOR_HELD {
        let (back, trip) = held.due(false, Some(sha));
        if !back.is_empty() {
            return_uses(db, held, back).await;
            drop(trip);
        } else {
            drop(trip);
            if !elsewhere && held.lock().in_flight == 0 {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(taken) = take_from_row(db, held, sha, hostname).await? {
            return Ok(Some(taken));
        }
    }
    Ok(None)
}

/// How long an enrollment that finds its token's row empty waits for uses held by any
/// replica to come back.
pub const WAIT_FOR_HELD: Duration = Duration::from_millis(2 * HOLD.as_millis() as u64);

/// Whether another replica may hold uses of the token: it is live and large enough to be
/// taken in blocks.
async fn maybe_held_elsewhere(db: &PgPool, sha: &str) -> sqlx::Result<bool> {
    let blocks = sqlx::query_scalar!(
        r#"SELECT node IS NULL AND max_uses >= $2 AS "blocks!" FROM enrollment_tokens
         WHERE token_sha256 = $1 AND revoked_at IS NULL AND expires_at > now()"#,
        sha,
        BLOCK_FROM,
    )
    .fetch_optional(db)
    .await?;
    Ok(blocks.is_some_and(|b| b))
}

async fn take_from_row(
    db: &PgPool,
    held: &TokenUses,
    sha: &str,
    hostname: &str,
) -> sqlx::Result<Option<TakenUse>> {
    let _trip = held.trip();
    let mut tx = db.begin().await?;
    sqlx::query!("SET LOCAL synchronous_commit = off")
        .execute(&mut *tx)
        .await?;
    // Locked first, then counted: the lock returns the row as the last committer left it,
    // so the block's size is decided on the uses really left.
    let row = sqlx::query!(
        "SELECT id, node, uses, max_uses, expires_at FROM enrollment_tokens
         WHERE token_sha256 = $1 AND uses < max_uses AND revoked_at IS NULL
           AND expires_at > now() AND (node IS NULL OR node = $2)
         FOR UPDATE",
        sha,
        hostname,
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| (r.id, r.node, r.uses, r.max_uses, r.expires_at));
    let taken = match row {
        None => None,
        Some((id, node, uses, max_uses, expires_at)) => {
            let n = if node.is_none() && max_uses - uses >= BLOCK_FROM {
                BLOCK
            } else {
                1
            };
            sqlx::query!(
                "UPDATE enrollment_tokens SET uses = uses + $2 WHERE id = $1",
                id,
                n
            )
            .execute(&mut *tx)
            .await?;
            held.row_trips.fetch_add(1, Ordering::Relaxed);
            Some((id, node, n, expires_at))
        }
    };
    tx.commit().await?;
    Ok(taken.map(|(id, node, n, expires_at)| {
        if n > 1 {
            held.hold(sha.to_string(), id, n - 1, expires_at);
        }
        TakenUse { id, node }
    }))
}

/// Returns uses to their tokens' rows; what could not be returned is kept and tried again.
/// The caller holds the trip ([`TokenUses::due`]) until this returns. Returns how many
/// tokens' uses it kept.
async fn return_uses(db: &PgPool, held: &TokenUses, uses: Vec<(Uuid, i32)>) -> usize {
    let mut failed = Vec::new();
    for (token_id, n) in uses {
        let given = sqlx::query!(
            "UPDATE enrollment_tokens SET uses = greatest(uses - $2, 0) WHERE id = $1",
            token_id,
            n
        )
        .execute(db)
        .await;
        if let Err(err) = given {
            tracing::warn!(%token_id, uses = n, error = %err, "enrollment token uses could not be given back yet; trying again");
            failed.push((token_id, n));
        }
    }
    let kept = failed.len();
    held.lock().failed.append(&mut failed);
    kept
}

/// Returns the use an enrollment took when the enrollment failed after taking it.
pub async fn give_back_one(db: &PgPool, held: &TokenUses, token_id: Uuid) {
    let _trip = held.trip();
    return_uses(db, held, vec![(token_id, 1)]).await;
}

/// Returns what is due (every held use with `all`), the trip counted until it is done;
/// how many tokens' uses were kept for a later try.
pub async fn return_due(db: &PgPool, held: &TokenUses, all: bool) -> usize {
    let (back, _trip) = held.due(all, None);
    return_uses(db, held, back).await
}
