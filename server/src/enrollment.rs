//! Enrollment as stored: the node a host name names (`nodes`), the agents that hold its
//! credential (`agents`) and the enrollments waiting for an admin (`pending_enrollments`).
//! Everything runs in the caller's transaction, beside its audit entry; the rules (who may
//! replace whom) are the API's. Never sees HTTP: its errors are `sqlx::Error`, and a row
//! that is not there is `None` for the caller to say.

use chrono::{DateTime, Utc};
use heddle_types::auth::PendingEnrollment;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// What an enrollment token's row says of it, for telling why it cannot be used.
pub struct TokenState {
    pub node: Option<String>,
    pub uses: i32,
    pub max_uses: i32,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

pub async fn token_state(
    tx: &mut PgConnection,
    secret_sha256: &str,
) -> sqlx::Result<Option<TokenState>> {
    sqlx::query_as!(
        TokenState,
        "SELECT node, uses, max_uses, expires_at, revoked_at FROM enrollment_tokens
         WHERE token_sha256 = $1",
        secret_sha256,
    )
    .fetch_optional(tx)
    .await
}

/// The node of a host name, created when new. The upsert locks the node's row, so
/// concurrent enrollments of one host name are serialised.
pub async fn upsert_node(tx: &mut PgConnection, hostname: &str) -> sqlx::Result<Uuid> {
    sqlx::query_scalar!(
        "INSERT INTO nodes (id, hostname) VALUES ($1, $2)
         ON CONFLICT (hostname) DO UPDATE SET hostname = EXCLUDED.hostname RETURNING id",
        Uuid::new_v4(),
        hostname,
    )
    .fetch_one(tx)
    .await
}

/// The node's agent that is not revoked, if it has one.
pub async fn live_agent(tx: &mut PgConnection, node_id: Uuid) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!(
        "SELECT id FROM agents WHERE node_id = $1 AND revoked_at IS NULL",
        node_id
    )
    .fetch_optional(tx)
    .await
}

/// Revokes the node's live agents, returning their ids.
pub async fn revoke_live_agents(tx: &mut PgConnection, node_id: Uuid) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        "UPDATE agents SET revoked_at = now() WHERE node_id = $1 AND revoked_at IS NULL RETURNING id",
        node_id,
    )
    .fetch_all(tx)
    .await
}

/// An agent about to hold a node's credential (the SHA-256 of its secret).
pub struct NewAgent<'a> {
    pub id: Uuid,
    pub node_id: Uuid,
    pub credential_sha256: &'a str,
    pub enrollment_token_id: Option<Uuid>,
    pub version: Option<&'a str>,
}

/// Stores the agent, heard now, and marks its node seen.
pub async fn insert_agent(tx: &mut PgConnection, new: &NewAgent<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO agents (id, node_id, credential_sha256, enrollment_token_id, version, last_heartbeat_at)
         VALUES ($1, $2, $3, $4, $5, now())",
        new.id,
        new.node_id,
        new.credential_sha256,
        new.enrollment_token_id,
        new.version,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE nodes SET last_seen_at = now() WHERE id = $1",
        new.node_id
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// An enrollment to hold for an admin: the SHA-256 of the ticket the agent asks again with.
pub struct NewPending<'a> {
    pub id: Uuid,
    pub node_id: Uuid,
    pub hostname: &'a str,
    pub ticket_sha256: &'a str,
    pub enrollment_token_id: Uuid,
    pub agent_version: Option<&'a str>,
}

pub async fn insert_pending(tx: &mut PgConnection, new: &NewPending<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO pending_enrollments (id, node_id, hostname, ticket_sha256, enrollment_token_id, agent_version)
         VALUES ($1, $2, $3, $4, $5, $6)",
        new.id,
        new.node_id,
        new.hostname,
        new.ticket_sha256,
        new.enrollment_token_id,
        new.agent_version,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// A held enrollment as its ticket finds it.
pub struct Ticket {
    pub id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    pub state: String,
    pub enrollment_token_id: Option<Uuid>,
    pub agent_version: Option<String>,
    pub decided_by: Option<String>,
}

/// The held enrollment of a ticket, locked until the caller's transaction ends.
pub async fn ticket_for_update(
    tx: &mut PgConnection,
    ticket_sha256: &str,
) -> sqlx::Result<Option<Ticket>> {
    sqlx::query_as!(
        Ticket,
        "SELECT id, node_id, hostname, state, enrollment_token_id, agent_version, decided_by
         FROM pending_enrollments WHERE ticket_sha256 = $1 FOR UPDATE",
        ticket_sha256,
    )
    .fetch_optional(tx)
    .await
}

/// The held enrollment got its credential: its ticket is spent.
pub async fn complete(tx: &mut PgConnection, id: Uuid, agent_id: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE pending_enrollments SET state = 'completed', agent_id = $2 WHERE id = $1",
        id,
        agent_id,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// A held enrollment's state and host name, locked until the caller's transaction ends.
pub async fn state_for_update(
    tx: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<(String, String)>> {
    let row = sqlx::query!(
        "SELECT state, hostname FROM pending_enrollments WHERE id = $1 FOR UPDATE",
        id
    )
    .fetch_optional(tx)
    .await?;
    Ok(row.map(|r| (r.state, r.hostname)))
}

/// An admin's decision on a held enrollment: `approved` or `rejected`.
pub async fn decide(tx: &mut PgConnection, id: Uuid, to: &str, by: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE pending_enrollments SET state = $2, decided_at = now(), decided_by = $3 WHERE id = $1",
        id,
        to,
        by,
    )
    .execute(tx)
    .await?;
    Ok(())
}

/// Reads pending enrollments, each with its node's live agent if it has one, with `$tail`
/// (filter, order, limit) after the join.
macro_rules! pending_enrollments {
    ($tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            PendingEnrollment,
            r#"SELECT p.id, p.hostname, p.node_id, p.agent_version, p.state, p.requested_at,
                    p.decided_at, p.decided_by, a.id AS "live_agent_id?",
                    a.last_heartbeat_at AS "live_agent_last_heartbeat_at?", p.enrollment_token_id
             FROM pending_enrollments p
             LEFT JOIN agents a ON a.node_id = p.node_id AND a.revoked_at IS NULL "# + $tail
            $(, $arg)*
        )
    };
}

/// Enrollments waiting for approval and approved ones not yet collected, oldest first.
pub async fn waiting(db: &PgPool) -> sqlx::Result<Vec<PendingEnrollment>> {
    pending_enrollments!(
        "WHERE p.state IN ('pending', 'approved') ORDER BY p.requested_at LIMIT 1000"
    )
    .fetch_all(db)
    .await
}

pub async fn pending(tx: &mut PgConnection, id: Uuid) -> sqlx::Result<PendingEnrollment> {
    pending_enrollments!("WHERE p.id = $1", id)
        .fetch_one(tx)
        .await
}

/// An agent as `GET /api/v1/agents` lists it, before its liveness is judged.
pub struct AgentRow {
    pub id: Uuid,
    pub node_id: Uuid,
    pub hostname: String,
    pub version: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// Every agent, revoked ones too, by host name and then age.
pub async fn agents(db: &PgPool) -> sqlx::Result<Vec<AgentRow>> {
    sqlx::query_as!(
        AgentRow,
        "SELECT a.id, a.node_id, n.hostname, a.version, a.created_at, a.last_heartbeat_at,
                a.revoked_at
         FROM agents a JOIN nodes n ON n.id = a.node_id ORDER BY n.hostname, a.created_at"
    )
    .fetch_all(db)
    .await
}

/// Revokes an agent (again is no change); false when there is no such agent.
pub async fn revoke_agent(tx: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    let done = sqlx::query!(
        "UPDATE agents SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1",
        id
    )
    .execute(tx)
    .await?;
    Ok(done.rows_affected() > 0)
}
