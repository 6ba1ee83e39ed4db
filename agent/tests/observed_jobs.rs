//! Observed jobs end to end: spool files → a real `heddle-agent run` → the server → a
//! verdict. A communicator spanning nodes that moved its bytes over sockets, on a node
//! whose facts show an ACTIVE InfiniBand port, fails the job and the node.
//!
//! The spool files are written by [`write_job_spool`]; it is the one place to change to
//! have them written by the real profiler plugin (its driver, `heddle-profiler-drive`).
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::path::{Path, PathBuf};

use heddle_types::health::{NodeHealth, Verdict};
use heddle_types::nodes::NodeDetail;
use heddle_types::observe::{
    CommObservation, JobIdentity, NetUse, OpBand, SPOOL_FORMAT, SpoolFile,
};
use heddle_types::observed::{ObservedJob, ObservedJobSummary};

mod lifecycle_support;
use lifecycle_support::*;

/// A machine with ACTIVE InfiniBand ports (`mlx5_*`), as sysfs.
fn ib_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bare-metal-ib12")
}

/// Writes what a two-node all-reduce job whose NCCL fell back to sockets leaves in the
/// job spool: one final file per local rank, as the profiler plugin writes them (temp
/// file, then rename), owned by the job's user (this process's). Returns the file paths.
fn write_job_spool(dir: &Path) -> Vec<PathBuf> {
    // SAFETY: no preconditions.
    let uid = unsafe { libc::geteuid() };
    (0..2u32)
        .map(|rank| {
            let file = SpoolFile {
                format: SPOOL_FORMAT,
                job: JobIdentity {
                    pid: 40_000 + rank,
                    uid,
                    start_ticks: 777,
                    slurm_job_id: Some("4242".into()),
                    slurm_step_id: Some("0".into()),
                    k8s_namespace: None,
                    k8s_pod: None,
                    comm: Some("train.py".into()),
                },
                seq: 9,
                is_final: true,
                written_at: chrono::Utc::now(),
                plugin_version: "0.1.0".into(),
                nccl_version: Some("2.28.9".into()),
                env_applied: None,
                comms: vec![CommObservation {
                    comm_hash: "5eed0fa11bac".into(),
                    name: None,
                    nranks: 4,
                    nnodes: 2,
                    rank,
                    ops: vec![OpBand {
                        func: "AllReduce".into(),
                        size_band: 28,
                        ops: 50,
                        bytes: 50 << 28,
                        time_ns: 50 * 120_000_000,
                        algos: [("Ring".to_string(), 50)].into(),
                        protos: [("Simple".to_string(), 50)].into(),
                        max_channels: 2,
                        exec_ops: 0,
                        exec_bytes: 0,
                        exec_ns: 0,
                    }],
                    net: vec![NetUse {
                        net: "Socket".into(),
                        ops: 4000,
                        bytes: 25 << 30,
                        inferred: false,
                    }],
                    proxy_ops: 0,
                    dropped_events: 0,
                    finalized_at: Some(chrono::Utc::now()),
                }],
                dropped_events: 0,
                dropped_comms: 0,
            };
            let name = format!("{}-{}.json", file.job.pid, file.job.start_ticks);
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, serde_json::to_vec(&file).unwrap()).unwrap();
            let path = dir.join(name);
            std::fs::rename(&tmp, &path).unwrap();
            path
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_fell_to_sockets_on_an_ib_node_fails_it() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("jobs");
    let token = server.enrollment_token().await;
    let fixture = ib_fixture();
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &dir.path().join("state"),
        &[
            "--facts-root",
            fixture.to_str().unwrap(),
            "--job-spool",
            spool.to_str().unwrap(),
            "--job-spool-interval",
            "200ms",
        ],
    );
    let api = Api::new(&server);
    // The verdict reads the node's facts: wait for them first.
    eventually("node facts with an ACTIVE IB port", &agent, || async {
        api.get::<NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| {
                n.facts
                    .as_ref()
                    .is_some_and(|f| f.to_string().contains("\"ACTIVE\""))
            })
    })
    .await;
    eventually("the job spool", &agent, || async {
        spool.is_dir().then_some(())
    })
    .await;

    // A hostile neighbour: a link to a file the agent can read and the job user cannot.
    let secret = dir.path().join("secret.json");
    std::fs::write(&secret, b"{}").unwrap();
    std::os::unix::fs::symlink(&secret, spool.join("evil.json")).unwrap();

    let files = write_job_spool(&spool);

    let job: ObservedJobSummary = eventually("an observed job that failed", &agent, || async {
        let jobs: Vec<ObservedJobSummary> = api.get(&format!("/jobs?node={HOST}")).await?;
        jobs.into_iter().find(|j| j.verdict == Verdict::Fail)
    })
    .await;
    assert_eq!(job.job_key, "slurm:4242.0");
    assert_eq!(job.processes, 2);
    assert!(job.finished);
    assert_eq!(job.reasons[0].code.as_deref(), Some("job-socket-fallback"));
    assert!(
        job.reasons[0].message.contains("mlx5"),
        "{}",
        job.reasons[0].message
    );

    let detail: ObservedJob = api.get(&format!("/jobs/{}", job.id)).await.unwrap();
    assert_eq!(detail.comms.len(), 1);
    let c = &detail.comms[0];
    assert_eq!(
        (c.transport.as_deref(), c.local_ranks, c.nnodes),
        (Some("Socket"), 2, 2)
    );
    let band = &c.bands[0];
    assert_eq!(
        (band.func.as_str(), band.size_band, band.ops),
        ("AllReduce", 28, 100)
    );
    // 256 MiB in 120 ms on 4 ranks: algbw 2.24 GB/s, busbw × 1.5.
    assert!((band.busbw_gbs.unwrap() - 3.355).abs() < 0.01, "{band:?}");

    let health: NodeHealth = api.get(&format!("/nodes/{HOST}/health")).await.unwrap();
    assert_eq!(health.verdict, Verdict::Fail);
    assert!(
        health
            .reasons
            .iter()
            .any(|r| r.code.as_deref() == Some("job-socket-fallback")),
        "{health:?}"
    );

    // Final files leave the spool once stored in the agent's outbox; the link is refused,
    // said once, removed, and its target left alone.
    eventually("final files removed", &agent, || async {
        files.iter().all(|f| !f.exists()).then_some(())
    })
    .await;
    eventually("the link refused", &agent, || async {
        (!spool.join("evil.json").exists()).then_some(())
    })
    .await;
    assert!(secret.exists());
    let log = agent.log();
    assert_eq!(log.matches("job spool file refused").count(), 1, "{log}");
    assert!(log.contains("symbolic link"), "{log}");
    // Nothing else arrived: one job.
    let jobs: Vec<ObservedJobSummary> = api.get("/jobs").await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
}
