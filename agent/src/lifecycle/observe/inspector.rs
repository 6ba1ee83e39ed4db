//! NCCL Inspector's JSON logs, for sites that already run it: one `<host>-pid<pid>.log` per
//! process in `NCCL_INSPECTOR_DUMP_DIR`, one JSON object per line, each the latest
//! completed collective of one communicator at a dump (`header`, `metadata`, `coll_perf`).
//!
//! Read with the job spool's rules for hostile files (no links followed, no blocking on a
//! FIFO, a regular file with one link; its owner is the job's uid), but a log only grows,
//! so its last [`MAX_SPOOL_FILE_LEN`] bytes are read rather than refusing it. The records
//! become the same [`SpoolFile`] shape, without a network: Inspector does not report one,
//! so these jobs are judged on bandwidth only. The logs are the site's: never removed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use chrono::{DateTime, Utc};
use heddle_types::observe::{
    CommObservation, JobIdentity, MAX_BANDS_PER_COMM, MAX_COMMS, MAX_SPOOL_FILE_LEN, OpBand,
    SPOOL_FORMAT, SpoolFile,
};
use serde::Deserialize;

use super::ingest::{JobSpool, Refusal};

/// Logs read in one scan at most.
const MAX_LOGS_PER_SCAN: usize = 256;

#[derive(Deserialize)]
struct Record {
    header: Header,
    metadata: Meta,
    coll_perf: CollPerf,
}

#[derive(Deserialize)]
struct Header {
    id: String,
    rank: u32,
    n_ranks: u32,
    nnodes: u32,
}

#[derive(Deserialize)]
struct Meta {
    dump_timestamp_us: u64,
    pid: u32,
}

#[derive(Deserialize)]
struct CollPerf {
    coll: String,
    coll_msg_size_bytes: u64,
    coll_exec_time_us: u64,
}

fn band(bytes: u64) -> u32 {
    if bytes <= 1 {
        0
    } else {
        63 - bytes.leading_zeros()
    }
}

/// The records of one log as one process's observation. Lines that do not parse (the
/// partial first line of a tail, a line being written) are skipped; none at all is a
/// refusal. `uid` is the log's owner.
pub fn parse_log(text: &[u8], uid: u32) -> Result<SpoolFile, Refusal> {
    struct Comm {
        rank: u32,
        nranks: u32,
        nnodes: u32,
        bands: BTreeMap<(String, u32), OpBand>,
    }
    let mut comms: HashMap<String, Comm> = HashMap::new();
    let (mut pid, mut last_us, mut records, mut dropped) = (None, 0u64, 0u64, 0u64);
    for line in text.split(|b| *b == b'\n') {
        let Ok(r) = serde_json::from_slice::<Record>(line) else {
            continue;
        };
        records += 1;
        pid.get_or_insert(r.metadata.pid);
        last_us = last_us.max(r.metadata.dump_timestamp_us);
        if !comms.contains_key(&r.header.id) && comms.len() >= MAX_COMMS {
            dropped += 1;
            continue;
        }
        let c = comms.entry(r.header.id.clone()).or_insert(Comm {
            rank: r.header.rank,
            nranks: r.header.n_ranks,
            nnodes: r.header.nnodes,
            bands: BTreeMap::new(),
        });
        let p = &r.coll_perf;
        let key = (p.coll.clone(), band(p.coll_msg_size_bytes));
        if !c.bands.contains_key(&key) && c.bands.len() >= MAX_BANDS_PER_COMM {
            dropped += 1;
            continue;
        }
        let b = c.bands.entry(key.clone()).or_insert(OpBand {
            func: key.0,
            size_band: key.1,
            ops: 0,
            bytes: 0,
            time_ns: 0,
            exec_ops: 0,
            exec_bytes: 0,
            exec_ns: 0,
            algos: BTreeMap::new(),
            protos: BTreeMap::new(),
            max_channels: 0,
        });
        b.ops += 1;
        b.bytes = b.bytes.saturating_add(p.coll_msg_size_bytes);
        b.time_ns = b
            .time_ns
            .saturating_add(p.coll_exec_time_us.saturating_mul(1000));
        // Inspector's time is the collective's execution: what a bandwidth is read from.
        b.exec_ops += 1;
        b.exec_bytes = b.exec_bytes.saturating_add(p.coll_msg_size_bytes);
        b.exec_ns = b.time_ns;
    }
    let Some(pid) = pid else {
        return Err(Refusal::Content("no NCCL Inspector record".into()));
    };
    let written_at: DateTime<Utc> =
        DateTime::from_timestamp_micros(i64::try_from(last_us).unwrap_or(0)).unwrap_or_default();
    let mut comms: Vec<CommObservation> = comms
        .into_iter()
        .map(|(id, c)| CommObservation {
            comm_hash: id,
            name: None,
            nranks: c.nranks,
            nnodes: c.nnodes,
            rank: c.rank,
            ops: c.bands.into_values().collect(),
            net: vec![],
            proxy_ops: 0,
            dropped_events: 0,
            finalized_at: None,
            progress: None,
        })
        .collect();
    comms.sort_by(|a, b| a.comm_hash.cmp(&b.comm_hash));
    let file = SpoolFile {
        format: SPOOL_FORMAT,
        job: JobIdentity {
            pid,
            uid,
            start_ticks: 0,
            slurm_job_id: None,
            slurm_step_id: None,
            k8s_namespace: None,
            k8s_pod: None,
            torchrun_run_id: None,
            comm: None,
        },
        // Grows with every dump: the latest read wins on the server.
        seq: last_us.max(records),
        is_final: false,
        written_at,
        plugin_version: "nccl-inspector".into(),
        nccl_version: None,
        env_applied: None,
        comms,
        dropped_events: dropped,
        dropped_comms: 0,
    };
    file.check().map_err(|e| Refusal::Content(e.to_string()))?;
    Ok(file)
}

/// A directory of Inspector logs.
pub struct InspectorDir {
    dir: JobSpool,
    seen: HashMap<OsString, (u64, i64, i64)>,
}

impl InspectorDir {
    /// The directory is the site's (any owner, no sticky bit required) but must not be a
    /// link; its files are opened with the job spool's rules.
    pub fn open(path: &Path) -> Result<InspectorDir, super::ingest::SpoolDirError> {
        Ok(InspectorDir {
            dir: JobSpool::open_any(path)?,
            seen: HashMap::new(),
        })
    }

    /// Logs that changed since the last scan, as observations.
    pub fn scan(&mut self) -> Vec<SpoolFile> {
        let names: Vec<OsString> = match std::fs::read_dir(self.dir.path()) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.file_name()))
                .filter(|n| n.as_bytes().ends_with(b".log"))
                .take(super::ingest::MAX_NAMES_PER_SCAN)
                .collect(),
            Err(err) => {
                tracing::warn!(dir = %self.dir.path().display(), error = %err, "cannot list NCCL Inspector logs");
                return vec![];
            }
        };
        let mut out = Vec::new();
        for name in names {
            if out.len() >= MAX_LOGS_PER_SCAN {
                break;
            }
            match self.read(&name) {
                Ok(Some(file)) => out.push(file),
                Ok(None) => {}
                Err(refusal) => {
                    tracing::warn!(dir = %self.dir.path().display(), file = ?name, reason = refusal.label(),
                        "NCCL Inspector log refused: {refusal}");
                }
            }
        }
        out
    }

    /// `None` when unchanged since it was last read.
    fn read(&mut self, name: &OsString) -> Result<Option<SpoolFile>, Refusal> {
        let mut file = self.dir.open_entry(name)?;
        let meta = file.metadata().map_err(|e| Refusal::Open(e.to_string()))?;
        if !meta.file_type().is_file() {
            let stamp = (meta.ino(), -1, -1);
            if self.seen.insert(name.clone(), stamp) == Some(stamp) {
                return Ok(None);
            }
            return Err(Refusal::NotRegular("non-regular file"));
        }
        if meta.nlink() != 1 {
            return Err(Refusal::HardLinked(meta.nlink()));
        }
        let stamp = (
            meta.ino(),
            meta.size() as i64,
            meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        );
        if self.seen.get(name) == Some(&stamp) {
            return Ok(None);
        }
        self.seen.insert(name.clone(), stamp);
        let start = meta.len().saturating_sub(MAX_SPOOL_FILE_LEN as u64);
        file.seek(SeekFrom::Start(start))
            .map_err(|e| Refusal::Open(e.to_string()))?;
        let mut bytes = Vec::new();
        file.take(MAX_SPOOL_FILE_LEN as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| Refusal::Open(e.to_string()))?;
        parse_log(&bytes, meta.uid()).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"header":{"id":"0x7f8c496ae9f661","rank":2,"n_ranks":8,"nnodes":2},"metadata":{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1748030377748202,"hostname":"example-hostname","pid":1639453},"coll_perf":{"coll":"AllReduce","coll_sn":1407,"coll_msg_size_bytes":17179869184,"coll_exec_time_us":61974,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":277.210914,"coll_busbw_gbs":485.119099}}
{"header":{"id":"0x7f8c496ae9f661","rank":2,"n_ranks":8,"nnodes":2},"metadata":{"inspector_output_format_version":"v4.0","git_rev":"","rec_mechanism":"nccl_profiler_interface","dump_timestamp_us":1748030377758202,"hostname":"example-hostname","pid":1639453},"coll_perf":{"coll":"AllReduce","coll_sn":1408,"coll_msg_size_bytes":17179869184,"coll_exec_time_us":61000,"coll_timing_source":"kernel_gpu","coll_algobw_gbs":281.6,"coll_busbw_gbs":492.8}}
{"header":{"id":"0x7f8c496ae9f661","rank":2,"n_ranks":8,"nnodes":2},"metadata":{"dump_ti"#;

    #[test]
    fn records_become_one_process_bands_without_a_network() {
        let f = parse_log(LOG.as_bytes(), 1000).unwrap();
        assert_eq!(
            (f.job.pid, f.job.uid, f.seq),
            (1639453, 1000, 1748030377758202)
        );
        assert_eq!(f.comms.len(), 1);
        let c = &f.comms[0];
        assert_eq!((c.rank, c.nranks, c.nnodes), (2, 8, 2));
        assert!(c.net.is_empty());
        assert_eq!(c.ops.len(), 1);
        let b = &c.ops[0];
        assert_eq!((b.func.as_str(), b.size_band, b.ops), ("AllReduce", 34, 2));
        // The same busbw as Inspector printed, from the summed rows.
        let (_, bus) =
            heddle_types::observed::bandwidths(&b.func, c.nranks, b.bytes, b.time_ns).unwrap();
        assert!((bus - 488.9).abs() < 0.5, "{bus}");
    }

    #[test]
    fn garbage_is_refused() {
        assert!(parse_log(b"not json\n{}\n", 1000).is_err());
        let long_id = LOG
            .lines()
            .next()
            .unwrap()
            .replace("0x7f8c496ae9f661", &"x".repeat(300));
        assert!(parse_log(long_id.as_bytes(), 1000).is_err());
    }

    #[test]
    fn a_log_in_a_directory_is_read_when_it_changes_and_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h-pid1.log"), LOG).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("evil.log")).unwrap();
        let mut d = InspectorDir::open(dir.path()).unwrap();
        let got = d.scan();
        assert_eq!(got.len(), 1);
        assert!(d.scan().is_empty(), "unchanged");
        assert!(
            dir.path().join("h-pid1.log").exists(),
            "the site's logs are kept"
        );
    }
}
