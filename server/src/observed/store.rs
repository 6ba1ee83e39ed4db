//! Storing and reading observed jobs. An upload lands in one transaction: each process's
//! job row (by node, job key and uid) and its communicators, each kept only if its `seq`
//! is higher than the one held, so a retried or reordered upload changes nothing. A node
//! keeps its `keep` most recently seen jobs, pruned in the transaction that adds one, as
//! its facts history is (`db::facts::prune_history`).

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use heddle_types::health::{Reason, Verdict};
use heddle_types::observe::{NetUse, OpBand};
use heddle_types::observed::{
    BandFigure, MAX_OBSERVATIONS_PER_UPLOAD, ObservationSource, ObservationUpload, ObservedComm,
    RankRow, Workload, WorkloadSummary, dominant_net, path_limit_gbs, workload_key,
};
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use super::ObservedError;

/// Most communicator rows (process × communicator) one job may hold across its nodes (its
/// group: job key, owner and scope, `observed_jobs.scope`): an upload's rows beyond it are
/// refused and counted, so that one job's files cannot grow the server's work on it
/// without bound.
pub const MAX_ROWS_PER_JOB: i64 = 4096;

/// What an upload changed.
#[derive(Debug, Default)]
pub struct Stored {
    pub stored: u32,
    pub unchanged: u32,
    /// Communicators refused because their job holds [`MAX_ROWS_PER_JOB`] rows.
    pub refused: u32,
    /// Jobs with a communicator stored or brought forward: the ones to judge again.
    pub jobs: Vec<Uuid>,
}

/// The upload's own bounds ([`heddle_types::observe::SpoolFile::check`]) and what Postgres
/// can hold, before anything is stored.
pub fn validate(upload: &ObservationUpload) -> Result<(), ObservedError> {
    let invalid = |m: String| Err(ObservedError::Invalid(m));
    if upload.observations.len() > MAX_OBSERVATIONS_PER_UPLOAD {
        return invalid(format!(
            "{} observations; at most {MAX_OBSERVATIONS_PER_UPLOAD} per upload",
            upload.observations.len()
        ));
    }
    for o in &upload.observations {
        let f = &o.file;
        f.check()
            .map_err(|e| ObservedError::Invalid(e.to_string()))?;
        if i64::try_from(f.seq).is_err() || i64::try_from(f.job.start_ticks).is_err() {
            return invalid("seq and start_ticks must fit in 63 bits".into());
        }
        let mut hashes = HashSet::new();
        for c in &f.comms {
            if [c.nranks, c.nnodes]
                .iter()
                .any(|n| i32::try_from(*n).is_err())
            {
                return invalid(format!("communicator {}: counts out of range", c.comm_hash));
            }
            if !hashes.insert(c.comm_hash.as_str()) {
                return invalid(format!("communicator {} appears twice", c.comm_hash));
            }
        }
    }
    Ok(())
}

/// Stores a validated upload from `node_id`'s agent.
pub async fn store(
    db: &PgPool,
    node_id: Uuid,
    upload: &ObservationUpload,
    keep: u32,
) -> Result<Stored, ObservedError> {
    validate(upload)?;
    let mut out = Stored::default();
    let mut tx = db.begin().await?;
    let mut added = false;
    for o in &upload.observations {
        let f = &o.file;
        let j = &f.job;
        let job = sqlx::query!(
            r#"INSERT INTO observed_jobs (node_id, job_key, source, uid, slurm_job_id, k8s_namespace, k8s_pod, comm)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (node_id, job_key, uid) DO UPDATE SET last_seen_at = now(), comm = coalesce(EXCLUDED.comm, observed_jobs.comm)
             RETURNING id, (xmax = 0) AS "inserted!""#,
            node_id,
            workload_key(j),
            o.source.as_str(),
            i64::from(j.uid),
            j.slurm_job_id,
            j.k8s_namespace,
            j.k8s_pod,
            j.comm,
        )
        .fetch_one(&mut *tx)
        .await?;
        let (job_id, inserted) = (job.id, job.inserted);
        added |= inserted;
        // The job's rows on every node, less this process's own (which it replaces).
        let held = sqlx::query_scalar!(
            r#"SELECT count(*) AS "n!" FROM observed_comms c JOIN observed_jobs j ON j.id = c.job_id
               JOIN observed_jobs me ON (me.job_key, me.uid, me.scope) = (j.job_key, j.uid, j.scope)
             WHERE me.id = $1 AND NOT (c.job_id = $1 AND c.pid = $2 AND c.start_ticks = $3)"#,
            job_id,
            i64::from(j.pid),
            j.start_ticks as i64,
        )
        .fetch_one(&mut *tx)
        .await?;
        if held + f.comms.len() as i64 > MAX_ROWS_PER_JOB {
            out.refused += f.comms.len() as u32;
            continue;
        }
        let comms: Vec<serde_json::Value> = f
            .comms
            .iter()
            .map(|c| {
                serde_json::json!({
                    "comm_hash": c.comm_hash, "name": c.name, "nranks": c.nranks,
                    "nnodes": c.nnodes, "rank": c.rank, "ops": c.ops, "net": c.net,
                    "finalized": c.finalized_at.is_some() || f.is_final,
                    "progress": c.progress,
                })
            })
            .collect();
        let done = sqlx::query!(
            "INSERT INTO observed_comms (job_id, pid, start_ticks, comm_hash, seq, is_final, written_at, env_applied,
                                         name, nranks, nnodes, rank, ops, net, finalized, progress, clock_offset_ns)
             SELECT $1, $2, $3, c.comm_hash, $4, $5, $6, $7, c.name, c.nranks, c.nnodes, c.rank, c.ops, c.net, c.finalized,
                    nullif(c.progress, 'null'::jsonb), $9
             FROM jsonb_to_recordset($8) AS c(comm_hash text, name text, nranks int, nnodes int, rank int,
                                              ops jsonb, net jsonb, finalized boolean, progress jsonb)
             ON CONFLICT (job_id, pid, start_ticks, comm_hash) DO UPDATE SET
                 seq = EXCLUDED.seq, is_final = EXCLUDED.is_final, written_at = EXCLUDED.written_at,
                 env_applied = EXCLUDED.env_applied, name = EXCLUDED.name, nranks = EXCLUDED.nranks,
                 nnodes = EXCLUDED.nnodes, rank = EXCLUDED.rank, ops = EXCLUDED.ops, net = EXCLUDED.net,
                 finalized = EXCLUDED.finalized, progress = EXCLUDED.progress,
                 clock_offset_ns = EXCLUDED.clock_offset_ns, received_at = now()
             WHERE observed_comms.seq < EXCLUDED.seq",
            job_id,
            i64::from(j.pid),
            j.start_ticks as i64,
            f.seq as i64,
            f.is_final,
            f.written_at,
            f.env_applied,
            serde_json::Value::Array(comms),
            upload.clock.map_or(0, |c| c.offset_ns),
        )
        .execute(&mut *tx)
        .await?;
        let stored = u32::try_from(done.rows_affected()).unwrap_or(u32::MAX);
        out.stored += stored;
        out.unchanged +=
            u32::try_from(f.comms.len()).unwrap_or(0) - stored.min(f.comms.len() as u32);
        if stored > 0 && !out.jobs.contains(&job_id) {
            out.jobs.push(job_id);
        }
    }
    if added {
        prune(&mut tx, node_id, keep).await?;
    }
    tx.commit().await?;
    Ok(out)
}

/// Drops a node's observed jobs beyond its `keep` most recently seen (at least one kept).
async fn prune(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    node_id: Uuid,
    keep: u32,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        "DELETE FROM observed_jobs WHERE id IN (
             SELECT id FROM observed_jobs WHERE node_id = $1
             ORDER BY last_seen_at DESC, id DESC OFFSET $2)",
        node_id,
        i64::from(keep.max(1)),
    )
    .execute(&mut **tx)
    .await?;
    if done.rows_affected() > 0 {
        // Verdicts across nodes of jobs no node holds any more.
        sqlx::query!(
            "DELETE FROM observed_progress p WHERE NOT EXISTS (
                 SELECT 1 FROM observed_jobs j WHERE (j.job_key, j.uid, j.scope) = (p.job_key, p.uid, p.scope))"
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(done.rows_affected())
}

/// One process's row of one communicator, as stored.
#[derive(Debug, Clone)]
pub struct CommRow {
    pub pid: i64,
    pub start_ticks: i64,
    pub comm_hash: String,
    pub seq: i64,
    pub is_final: bool,
    pub written_at: DateTime<Utc>,
    pub env_applied: Option<String>,
    pub name: Option<String>,
    pub nranks: i32,
    pub nnodes: i32,
    pub rank: i32,
    pub ops: Json<Vec<OpBand>>,
    pub net: Json<Vec<NetUse>>,
    pub finalized: bool,
}

pub async fn comm_rows(db: &PgPool, job_id: Uuid) -> Result<Vec<CommRow>, sqlx::Error> {
    sqlx::query_as!(
        CommRow,
        r#"SELECT pid, start_ticks, comm_hash, seq, is_final, written_at, env_applied, name, nranks, nnodes, rank,
                ops AS "ops: Json<Vec<OpBand>>", net AS "net: Json<Vec<NetUse>>", finalized
         FROM observed_comms WHERE job_id = $1 ORDER BY comm_hash, rank, pid"#,
        job_id,
    )
    .fetch_all(db)
    .await
}

fn count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// A job's communicators as people read them: each communicator's rows of the node's
/// processes summed per function and size band (so a band's bandwidth is the mean over
/// its operations and local ranks), and their networks summed.
pub fn merge(rows: &[CommRow]) -> Vec<ObservedComm> {
    let mut by_hash: BTreeMap<&str, Vec<&CommRow>> = BTreeMap::new();
    for r in rows {
        by_hash.entry(&r.comm_hash).or_default().push(r);
    }
    by_hash
        .into_values()
        .map(|rs| {
            let first = rs[0];
            // Summed over the node's ranks; bandwidth from what was timed on the GPU.
            let mut bands: BTreeMap<(String, u32), OpBand> = BTreeMap::new();
            let mut nets: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            let mut inferred_nets: std::collections::BTreeSet<String> = Default::default();
            for r in &rs {
                for b in r.ops.iter() {
                    let e = bands
                        .entry((b.func.clone(), b.size_band))
                        .or_insert_with(|| OpBand {
                            func: b.func.clone(),
                            size_band: b.size_band,
                            ops: 0,
                            bytes: 0,
                            time_ns: 0,
                            exec_ops: 0,
                            exec_bytes: 0,
                            exec_ns: 0,
                            algos: Default::default(),
                            protos: Default::default(),
                            max_channels: 0,
                        });
                    e.ops = e.ops.saturating_add(b.ops);
                    e.bytes = e.bytes.saturating_add(b.bytes);
                    e.time_ns = e.time_ns.saturating_add(b.time_ns);
                    let (tb, tn) = b.timed();
                    if tn > 0 {
                        e.exec_ops = e.exec_ops.saturating_add(b.exec_ops);
                        e.exec_bytes = e.exec_bytes.saturating_add(tb);
                        e.exec_ns = e.exec_ns.saturating_add(tn);
                    }
                }
                for n in r.net.iter() {
                    if n.inferred {
                        inferred_nets.insert(n.net.clone());
                    }
                    let e = nets.entry(n.net.clone()).or_default();
                    e.0 = e.0.saturating_add(n.ops);
                    e.1 = e.1.saturating_add(n.bytes);
                }
            }
            let nranks = count(first.nranks);
            let net: Vec<NetUse> = nets
                .into_iter()
                .map(|(net, (ops, bytes))| {
                    let inferred = inferred_nets.contains(&net);
                    NetUse {
                        net,
                        ops,
                        bytes,
                        inferred,
                    }
                })
                .collect();
            let nnodes = count(first.nnodes);
            let transport = dominant_net(&net).map(str::to_string);
            let limit = path_limit_gbs(transport.as_deref(), nnodes);
            ObservedComm {
                comm_hash: first.comm_hash.clone(),
                name: first.name.clone(),
                nranks,
                nnodes,
                local_ranks: u32::try_from(rs.len()).unwrap_or(u32::MAX),
                transport,
                net,
                bands: bands
                    .values()
                    .map(|b| BandFigure::of(b, nranks, limit))
                    .collect(),
                finalized: rs.iter().all(|r| r.finalized),
                seq: rs.iter().map(|r| r.seq).max().unwrap_or(0).max(0) as u64,
                written_at: rs.iter().map(|r| r.written_at).max().unwrap_or_default(),
            }
        })
        .collect()
}

/// A row of the `observed_job_summaries` view.
struct SummaryRow {
    id: Uuid,
    node_id: Uuid,
    hostname: String,
    job_key: String,
    source: String,
    uid: i64,
    slurm_job_id: Option<String>,
    k8s_namespace: Option<String>,
    k8s_pod: Option<String>,
    comm: Option<String>,
    first_seen_at: DateTime<Utc>,
    last_seen_at: DateTime<Utc>,
    verdict: String,
    reasons: Json<Vec<Reason>>,
    processes: i64,
    communicators: i64,
    finished: bool,
    env_applied: Option<String>,
    progress_verdict: Option<String>,
    progress_reasons: Option<Json<Vec<Reason>>>,
}

/// Reads `observed_job_summaries` into [`SummaryRow`]s, with `$tail` (the filters, order
/// and limit) after its `FROM`. A view's columns all read as nullable, so each says here
/// which it is.
macro_rules! summaries {
    ($tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            SummaryRow,
            r#"SELECT id AS "id!", node_id AS "node_id!", hostname AS "hostname!", job_key AS "job_key!",
                      source AS "source!", uid AS "uid!", slurm_job_id, k8s_namespace, k8s_pod, comm,
                      first_seen_at AS "first_seen_at!", last_seen_at AS "last_seen_at!", verdict AS "verdict!",
                      reasons AS "reasons!: Json<Vec<Reason>>", processes AS "processes!",
                      communicators AS "communicators!", finished AS "finished!", env_applied,
                      progress_verdict, progress_reasons AS "progress_reasons: Json<Vec<Reason>>"
               FROM observed_job_summaries "# + $tail
            $(, $arg)*
        )
    };
}

impl SummaryRow {
    fn into_summary(self) -> WorkloadSummary {
        // The table's CHECK admits only the four names.
        let own: Verdict = self.verdict.parse().unwrap_or(Verdict::Unknown);
        let across: Option<Verdict> = self.progress_verdict.and_then(|v| v.parse().ok());
        // Hung or straggling across nodes outranks what the node's own rules said.
        let (verdict, mut reasons) = match across {
            Some(v @ (Verdict::Fail | Verdict::Warn)) if own != Verdict::Fail => {
                (v, self.progress_reasons.map(|r| r.0).unwrap_or_default())
            }
            Some(Verdict::Fail | Verdict::Warn) => {
                (own, self.progress_reasons.map(|r| r.0).unwrap_or_default())
            }
            _ => (own, Vec::new()),
        };
        reasons.extend(self.reasons.0);
        reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
        WorkloadSummary {
            id: self.id,
            node_id: self.node_id,
            hostname: self.hostname,
            workload_key: self.job_key,
            source: if self.source == "inspector" {
                ObservationSource::Inspector
            } else {
                ObservationSource::Profiler
            },
            uid: u32::try_from(self.uid).unwrap_or(u32::MAX),
            slurm_job_id: self.slurm_job_id,
            k8s_namespace: self.k8s_namespace,
            k8s_pod: self.k8s_pod,
            comm: self.comm,
            processes: u32::try_from(self.processes).unwrap_or(u32::MAX),
            communicators: u32::try_from(self.communicators).unwrap_or(u32::MAX),
            finished: self.finished,
            env_applied: self.env_applied,
            first_seen_at: self.first_seen_at,
            last_seen_at: self.last_seen_at,
            verdict,
            reasons,
        }
    }
}

/// Where a job sorts in lists (most recently seen first), and what a cursor resumes after.
pub fn list_key(j: &WorkloadSummary) -> String {
    format!(
        "{}|{}",
        j.last_seen_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        j.id
    )
}

/// Parses a [`list_key`].
pub fn parse_list_key(key: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let (at, id) = key.split_once('|')?;
    Some((
        DateTime::parse_from_rfc3339(at).ok()?.into(),
        id.parse().ok()?,
    ))
}

/// Observed jobs, most recently seen first: `limit + 1` of them (for [`crate::api::page`]),
/// after `after`, of one node and of one Slurm job when given.
///
/// One statement per filter that narrows the list, rather than `$1 IS NULL OR node_id =
/// $1`: Postgres keeps a prepared statement's generic plan after five runs, and with such a
/// filter the generic plan estimates one row, scans and counts every kept job and sorts
/// them (1 s at 50,000 jobs, `scripts/bench-observed.sh`), where each statement here walks
/// its index in order and stops at the page (2 ms).
pub async fn list(
    db: &PgPool,
    node: Option<Uuid>,
    slurm_job: Option<&str>,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<WorkloadSummary>, ObservedError> {
    let (at, id) = (after.map(|a| a.0), after.map(|a| a.1));
    let rows = match (node, slurm_job) {
        (Some(node), slurm_job) => {
            summaries!(
                "WHERE node_id = $1 AND ($5::text IS NULL OR slurm_job_id = $5)
                   AND ($2::timestamptz IS NULL OR (last_seen_at, id) < ($2, $3))
                 ORDER BY last_seen_at DESC, id DESC LIMIT $4",
                node,
                at,
                id,
                limit + 1,
                slurm_job,
            )
            .fetch_all(db)
            .await?
        }
        (None, Some(slurm_job)) => {
            summaries!(
                "WHERE slurm_job_id = $1
                   AND ($2::timestamptz IS NULL OR (last_seen_at, id) < ($2, $3))
                 ORDER BY last_seen_at DESC, id DESC LIMIT $4",
                slurm_job,
                at,
                id,
                limit + 1,
            )
            .fetch_all(db)
            .await?
        }
        (None, None) => {
            summaries!(
                "WHERE ($1::timestamptz IS NULL OR (last_seen_at, id) < ($1, $2))
                 ORDER BY last_seen_at DESC, id DESC LIMIT $3",
                at,
                id,
                limit + 1,
            )
            .fetch_all(db)
            .await?
        }
    };
    Ok(rows.into_iter().map(SummaryRow::into_summary).collect())
}

pub async fn summary(db: &PgPool, id: Uuid) -> Result<WorkloadSummary, ObservedError> {
    let row = summaries!("WHERE id = $1", id).fetch_optional(db).await?;
    row.map(SummaryRow::into_summary)
        .ok_or(ObservedError::NoSuchJob(id))
}

pub async fn get(db: &PgPool, id: Uuid) -> Result<Workload, ObservedError> {
    let summary = summary(db, id).await?;
    let comms = merge(&comm_rows(db, id).await?);
    let ranks = sqlx::query_scalar!(
        r#"SELECT p.ranks AS "ranks: Json<Vec<RankRow>>"
         FROM observed_jobs j JOIN observed_progress p ON (p.job_key, p.uid, p.scope) = (j.job_key, j.uid, j.scope)
         WHERE j.id = $1"#,
        id,
    )
    .fetch_optional(db)
    .await?;
    Ok(Workload {
        summary,
        comms,
        ranks: ranks.map(|r| r.0).unwrap_or_default(),
    })
}

pub async fn set_verdict(
    db: &PgPool,
    id: Uuid,
    verdict: Verdict,
    reasons: &[Reason],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE observed_jobs SET verdict = $2, reasons = $3, judged_at = now() WHERE id = $1",
        id,
        verdict.as_str(),
        Json(reasons) as _,
    )
    .execute(db)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank's row: ten 256 MiB all-reduces launched in 50 µs each, `exec_ns` of them
    /// timed on the GPU.
    fn row(rank: i32, net: &[(&str, u64)], exec_ns: u64) -> CommRow {
        CommRow {
            pid: 100 + i64::from(rank),
            start_ticks: 1,
            comm_hash: "c1".into(),
            seq: 3,
            is_final: false,
            written_at: Utc::now(),
            env_applied: None,
            name: None,
            nranks: 16,
            nnodes: 2,
            rank,
            ops: Json(vec![OpBand {
                func: "AllReduce".into(),
                size_band: 28,
                ops: 10,
                bytes: 10 << 28,
                time_ns: 500_000,
                algos: Default::default(),
                protos: Default::default(),
                max_channels: 0,
                exec_ops: if exec_ns > 0 { 10 } else { 0 },
                exec_bytes: if exec_ns > 0 { 10 << 28 } else { 0 },
                exec_ns,
            }]),
            net: Json(
                net.iter()
                    .map(|(n, b)| NetUse {
                        net: (*n).into(),
                        ops: 1,
                        bytes: *b,
                        inferred: false,
                    })
                    .collect(),
            ),
            finalized: false,
        }
    }

    #[test]
    fn ranks_of_a_node_merge_into_one_communicator() {
        let merged = merge(&[
            row(0, &[("Socket", 100), ("IB", 1)], 1_000_000_000),
            row(1, &[("Socket", 50)], 3_000_000_000),
        ]);
        assert_eq!(merged.len(), 1);
        let c = &merged[0];
        assert_eq!((c.local_ranks, c.nranks, c.nnodes), (2, 16, 2));
        assert_eq!(c.transport.as_deref(), Some("Socket"));
        assert_eq!(c.bands.len(), 1);
        let b = &c.bands[0];
        assert_eq!((b.ops, b.bytes, b.time_ns), (20, 20 << 28, 1_000_000));
        // The mean of the GPU times: 2 × 2.5 GiB in 4 s.
        assert!(
            (b.algbw_gbs.unwrap() - 1.342).abs() < 0.01,
            "{:?}",
            b.algbw_gbs
        );
        assert_eq!(b.gpu_timed_ops, 20);
    }

    #[test]
    fn host_launch_time_is_never_a_bandwidth() {
        // Nothing timed on the GPU: 20 × 256 MiB over 1 ms of launches would read as
        // 5,369 GB/s over sockets.
        let merged = merge(&[row(0, &[("Socket", 1)], 0), row(1, &[("Socket", 1)], 0)]);
        let b = &merged[0].bands[0];
        assert_eq!((b.algbw_gbs, b.busbw_gbs), (None, None), "{b:?}");
        assert!(b.note.as_deref().unwrap().contains("GPU"), "{b:?}");
        // One rank timed on the GPU: its operations alone give the figure.
        let merged = merge(&[
            row(0, &[("Socket", 1)], 2_000_000_000),
            row(1, &[("Socket", 1)], 0),
        ]);
        let b = &merged[0].bands[0];
        assert!((b.algbw_gbs.unwrap() - 1.342).abs() < 0.01, "{b:?}");
        assert_eq!(b.gpu_timed_ops, 10);
        // GPU times that no socket could carry: no figure, and said why.
        let merged = merge(&[row(0, &[("Socket", 1)], 1_000)]);
        let b = &merged[0].bands[0];
        assert_eq!(b.busbw_gbs, None, "{b:?}");
        assert!(b.note.as_deref().unwrap().contains("limit"), "{b:?}");
    }

    #[test]
    fn list_keys_round_trip() {
        let at: DateTime<Utc> = "2026-11-27T12:00:00.123456Z".parse().unwrap();
        let id = Uuid::from_u128(7);
        let key = format!("{}|{id}", at.to_rfc3339());
        assert_eq!(parse_list_key(&key), Some((at, id)));
        assert_eq!(parse_list_key("garbage"), None);
    }
}
