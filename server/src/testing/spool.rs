//! Profiler spool files as a job's rank writes them, for tests that play observed jobs
//! through the agent protocol (`POST /api/v1/agent/observations`).

use heddle_types::observe::progress::CLOCK_REALTIME;
use heddle_types::observe::{
    CommObservation, Completion, InFlight, JobIdentity, Progress, SPOOL_FORMAT, SpoolFile,
};
use heddle_types::observed::{Observation, ObservationSource};
use serde_json::{Value, json};

const S: u64 = 1_000_000_000;

/// Now on the realtime clock, in nanoseconds.
pub fn now_ns() -> u64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default() as u64
}

/// Rank `rank` of a 2-rank communicator `c0ffee` of Slurm job `job` (user `uid`, process
/// `pid`): `started` collectives started, the last `quiet_s` ago; the last one (a 1 MiB
/// AllReduce) in flight unless `done`.
pub fn rank_file(
    job: &str,
    uid: u32,
    pid: u32,
    rank: u32,
    started: u64,
    done: bool,
    quiet_s: u64,
) -> SpoolFile {
    let last = now_ns() - quiet_s * S;
    let coll_done = if done { started } else { started - 1 };
    SpoolFile {
        format: SPOOL_FORMAT,
        job: JobIdentity {
            pid,
            uid,
            start_ticks: 7,
            slurm_job_id: Some(job.into()),
            slurm_step_id: None,
            k8s_namespace: None,
            k8s_pod: None,
            torchrun_run_id: None,
            comm: Some("train".into()),
        },
        seq: 1,
        is_final: false,
        written_at: chrono::Utc::now(),
        plugin_version: "0.2.0".into(),
        nccl_version: None,
        env_applied: None,
        comms: vec![CommObservation {
            comm_hash: "c0ffee".into(),
            name: None,
            nranks: 2,
            nnodes: 2,
            rank,
            ops: vec![],
            net: vec![],
            proxy_ops: 4,
            dropped_events: 0,
            finalized_at: None,
            progress: Some(Progress {
                clock: CLOCK_REALTIME.into(),
                now_ns: now_ns(),
                coll_started: started,
                coll_done,
                p2p_started: 0,
                p2p_done: 0,
                last_start_ns: last,
                in_flight: (!done).then(|| InFlight {
                    seq: started,
                    p2p: false,
                    nccl_seq: Some(started - 1),
                    func: "AllReduce".into(),
                    bytes: 1 << 20,
                    started_ns: last,
                }),
                completion: Completion::Proxy,
                proxy_in_flight: u64::from(!done),
                proxy_last_stop_ns: last,
                arrivals: vec![[started, last]],
            }),
        }],
        dropped_events: 0,
        dropped_comms: 0,
    }
}

/// The body of `POST /api/v1/agent/observations` carrying `files`.
pub fn upload(files: &[SpoolFile]) -> Value {
    let observations: Vec<Observation> = files
        .iter()
        .map(|f| Observation {
            source: ObservationSource::Profiler,
            file: f.clone(),
        })
        .collect();
    json!({ "observations": observations })
}
