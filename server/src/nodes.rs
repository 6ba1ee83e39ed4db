//! Nodes as stored (`nodes`, `node_facts_history`), the sites they belong to (`sites`) and
//! the tuning profiles kept for a node or a site (`tuning_profiles`). Changes run in the
//! caller's transaction, beside its audit entry and the job environment's bookkeeping
//! (`job_env`). Never sees HTTP: its errors are `sqlx::Error`, a row that is not there is
//! `None`, and a taken name is the caller's to say.

pub mod list;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use heddle_types::nodes::{FactsSnapshot, NodeSummary, Site, TuningProfile};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::db;

/// A node's row as `GET /api/v1/nodes` lists it, before its liveness is judged.
#[derive(sqlx::FromRow)]
pub struct NodeRow {
    pub id: Uuid,
    pub hostname: String,
    pub site: Option<String>,
    pub gpu_model: Option<String>,
    pub gpu_count: i32,
    pub hcas: Vec<String>,
    pub port_states: Vec<String>,
    pub link_layers: Vec<String>,
    pub traits: Json<BTreeMap<String, String>>,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub facts_updated_at: Option<DateTime<Utc>>,
}

/// The columns of [`NodeRow`], for the node list's filtered queries (`n` is `nodes`).
pub const NODE_SELECT: &str =
    "SELECT n.id, n.hostname, s.name AS site, n.gpu_model, n.gpu_count, n.hcas,
    n.port_states, n.link_layers, n.traits, n.last_seen_at, n.facts_updated_at
    FROM nodes n LEFT JOIN sites s ON s.id = n.site_id";

impl NodeRow {
    /// The row as the API shows it, its liveness judged against the heartbeat interval.
    pub fn summary(self, heartbeat: Duration) -> NodeSummary {
        NodeSummary {
            liveness: db::liveness(self.last_seen_at, heartbeat),
            id: self.id,
            hostname: self.hostname,
            site: self.site,
            gpu_model: self.gpu_model,
            gpu_count: self.gpu_count,
            hcas: self.hcas,
            port_states: self.port_states,
            link_layers: self.link_layers,
            traits: self.traits.0,
            last_seen_at: self.last_seen_at,
            facts_updated_at: self.facts_updated_at,
        }
    }
}

pub async fn node(db: &PgPool, id: Uuid) -> sqlx::Result<NodeRow> {
    sqlx::query_as!(
        NodeRow,
        r#"SELECT n.id, n.hostname, s.name AS "site?", n.gpu_model, n.gpu_count, n.hcas,
                n.port_states, n.link_layers,
                n.traits AS "traits: Json<BTreeMap<String, String>>",
                n.last_seen_at, n.facts_updated_at
         FROM nodes n LEFT JOIN sites s ON s.id = n.site_id WHERE n.id = $1"#,
        id,
    )
    .fetch_one(db)
    .await
}

/// The node's latest facts and their hash; `None` before its agent sent any.
pub async fn facts(
    db: &PgPool,
    id: Uuid,
) -> sqlx::Result<(Option<serde_json::Value>, Option<String>)> {
    let row = sqlx::query!("SELECT facts, facts_sha256 FROM nodes WHERE id = $1", id)
        .fetch_one(db)
        .await?;
    Ok((row.facts, row.facts_sha256))
}

/// The node's past facts, newest first: one entry per change.
pub async fn facts_history(db: &PgPool, id: Uuid, limit: i64) -> sqlx::Result<Vec<FactsSnapshot>> {
    sqlx::query_as!(
        FactsSnapshot,
        "SELECT id, facts_sha256, collected_at, facts FROM node_facts_history
         WHERE node_id = $1 ORDER BY id DESC LIMIT $2",
        id,
        limit,
    )
    .fetch_all(db)
    .await
}

/// Attaches the node to a site, or detaches it (`None`).
pub async fn set_site(tx: &mut PgConnection, id: Uuid, site_id: Option<Uuid>) -> sqlx::Result<()> {
    sqlx::query!("UPDATE nodes SET site_id = $2 WHERE id = $1", id, site_id)
        .execute(tx)
        .await?;
    Ok(())
}

/// Stores a site; a taken name is a unique violation.
pub async fn insert_site(
    tx: &mut PgConnection,
    name: &str,
    traits: &BTreeMap<String, String>,
) -> sqlx::Result<Site> {
    let r = sqlx::query!(
        r#"INSERT INTO sites (id, name, traits) VALUES ($1, $2, $3)
         RETURNING id, name, traits AS "traits: Json<BTreeMap<String, String>>", created_at"#,
        Uuid::new_v4(),
        name,
        Json(traits) as _,
    )
    .fetch_one(tx)
    .await?;
    Ok(Site {
        id: r.id,
        name: r.name,
        traits: r.traits.0,
        created_at: r.created_at,
    })
}

/// Every site, by name.
pub async fn sites(db: &PgPool) -> sqlx::Result<Vec<Site>> {
    let rows = sqlx::query!(
        r#"SELECT id, name, traits AS "traits: Json<BTreeMap<String, String>>", created_at
         FROM sites ORDER BY name"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Site {
            id: r.id,
            name: r.name,
            traits: r.traits.0,
            created_at: r.created_at,
        })
        .collect())
}

/// A tuning profile to store; its name and env are already checked.
pub struct NewProfile<'a> {
    pub name: &'a str,
    pub node_id: Option<Uuid>,
    pub site_id: Option<Uuid>,
    pub env: &'a BTreeMap<String, String>,
    pub source_run_id: Option<Uuid>,
}

struct ProfileRow {
    id: Uuid,
    name: String,
    node_id: Option<Uuid>,
    site_id: Option<Uuid>,
    env: Json<BTreeMap<String, String>>,
    source_run_id: Option<Uuid>,
    created_by: String,
    created_at: DateTime<Utc>,
}

impl From<ProfileRow> for TuningProfile {
    fn from(r: ProfileRow) -> Self {
        TuningProfile {
            id: r.id,
            name: r.name,
            node_id: r.node_id,
            site_id: r.site_id,
            env: r.env.0,
            source_run_id: r.source_run_id,
            created_by: r.created_by,
            created_at: r.created_at,
        }
    }
}

/// Stores a tuning profile; a taken name is a unique violation.
pub async fn insert_profile(
    tx: &mut PgConnection,
    p: &NewProfile<'_>,
    created_by: &str,
) -> sqlx::Result<TuningProfile> {
    let row = sqlx::query_as!(
        ProfileRow,
        r#"INSERT INTO tuning_profiles (id, name, node_id, site_id, env, source_run_id, created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         RETURNING id, name, node_id, site_id,
             env AS "env: Json<BTreeMap<String, String>>", source_run_id, created_by, created_at"#,
        Uuid::new_v4(),
        p.name,
        p.node_id,
        p.site_id,
        Json(p.env) as _,
        p.source_run_id,
        created_by,
    )
    .fetch_one(tx)
    .await?;
    Ok(row.into())
}

/// Every tuning profile, by name.
pub async fn profiles(db: &PgPool) -> sqlx::Result<Vec<TuningProfile>> {
    let rows = sqlx::query_as!(
        ProfileRow,
        r#"SELECT id, name, node_id, site_id, env AS "env: Json<BTreeMap<String, String>>",
             source_run_id, created_by, created_at
         FROM tuning_profiles ORDER BY name"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Deletes a tuning profile, returning it; `None` when there is none by that id.
pub async fn delete_profile(
    tx: &mut PgConnection,
    id: Uuid,
) -> sqlx::Result<Option<TuningProfile>> {
    let row = sqlx::query_as!(
        ProfileRow,
        r#"DELETE FROM tuning_profiles WHERE id = $1
         RETURNING id, name, node_id, site_id,
             env AS "env: Json<BTreeMap<String, String>>", source_run_id, created_by, created_at"#,
        id,
    )
    .fetch_optional(tx)
    .await?;
    Ok(row.map(Into::into))
}

/// What a node about to be removed still has: its host name, its jobs that are queued,
/// leased or running, all its jobs and their results, and its agents (revoked or not).
pub struct Holdings {
    pub hostname: String,
    pub active_jobs: i64,
    pub jobs: i64,
    pub results: i64,
    pub agents: Vec<Uuid>,
}

/// Locks the node's row (no run adds a job to it until the caller's transaction ends) and
/// says what it still has.
pub async fn lock_for_removal(tx: &mut PgConnection, id: Uuid) -> sqlx::Result<Holdings> {
    let hostname = sqlx::query_scalar!("SELECT hostname FROM nodes WHERE id = $1 FOR UPDATE", id)
        .fetch_one(&mut *tx)
        .await?;
    let counts = sqlx::query!(
        r#"SELECT count(*) FILTER (WHERE j.state IN ('queued', 'leased', 'running')) AS "active!",
                count(*) AS "jobs!", count(r.id) AS "results!"
         FROM jobs j LEFT JOIN results r ON r.job_id = j.id WHERE j.node_id = $1"#,
        id,
    )
    .fetch_one(&mut *tx)
    .await?;
    let agents = sqlx::query_scalar!("SELECT id FROM agents WHERE node_id = $1", id)
        .fetch_all(&mut *tx)
        .await?;
    Ok(Holdings {
        hostname,
        active_jobs: counts.active,
        jobs: counts.jobs,
        results: counts.results,
        agents,
    })
}

/// Deletes the node; what is only about it goes with it (the schema's cascades).
pub async fn delete(tx: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM nodes WHERE id = $1", id)
        .execute(tx)
        .await?;
    Ok(())
}

/// Stores facts the agent sent when their hash differs from the stored one, with an
/// entry in the node's facts history (kept to its last `keep_history`); false when they
/// were already stored.
pub async fn store_facts(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    id: Uuid,
    facts: &serde_json::Value,
    sha256: &str,
    keep_history: u32,
) -> sqlx::Result<bool> {
    let cols = db::facts::extract(facts);
    let changed = sqlx::query_scalar!(
        "UPDATE nodes SET facts = $2, facts_sha256 = $3, facts_updated_at = now(), gpu_model = $4,
                gpu_count = $5, hcas = $6, port_states = $7, link_layers = $8
         WHERE id = $1 AND facts_sha256 IS DISTINCT FROM $3 RETURNING id",
        id,
        facts,
        sha256,
        cols.gpu_model,
        cols.gpu_count,
        &cols.hcas,
        &cols.port_states,
        &cols.link_layers,
    )
    .fetch_optional(&mut **tx)
    .await?;
    if changed.is_none() {
        return Ok(false);
    }
    sqlx::query!(
        "INSERT INTO node_facts_history (node_id, facts_sha256, facts) VALUES ($1, $2, $3)",
        id,
        sha256,
        facts,
    )
    .execute(&mut **tx)
    .await?;
    db::facts::prune_history(tx, id, keep_history).await?;
    Ok(true)
}

pub async fn hostname(db: &PgPool, id: Uuid) -> sqlx::Result<String> {
    sqlx::query_scalar!("SELECT hostname FROM nodes WHERE id = $1", id)
        .fetch_one(db)
        .await
}
