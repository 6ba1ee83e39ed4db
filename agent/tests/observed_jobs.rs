//! Observed jobs end to end: spool files → a real `heddle-agent run` → the server → a
//! verdict. A communicator spanning nodes that moved its bytes over sockets, on a node
//! whose facts show an ACTIVE InfiniBand port, fails the job and the node.
//!
//! The spool files are written by the real profiler plugin, driven through its C ABI as
//! NCCL would by `heddle-profiler-drive` ([`write_job_spool`]).
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::path::{Path, PathBuf};

use heddle_types::health::{NodeHealth, Verdict};
use heddle_types::nodes::NodeDetail;
use heddle_types::observed::{Workload, WorkloadSummary};

mod lifecycle_support;
use lifecycle_support::*;

/// A machine with ACTIVE InfiniBand ports (`mlx5_*`), as sysfs.
fn ib_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bare-metal-ib12")
}

/// The profiler plugin and its driver as the workspace built them (`target/<profile>/`,
/// beside this test's `deps/`): `cargo test --workspace` builds both.
fn profiler_artifacts() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/<profile>/deps");
    let drive = profile_dir.join("heddle-profiler-drive");
    let lib = profile_dir.join("libheddle_nccl_profiler.so");
    assert!(
        drive.is_file() && lib.is_file(),
        "{} and {} are not built: run `cargo build -p heddle-nccl-profiler` (cargo test \
         --workspace builds them)",
        drive.display(),
        lib.display()
    );
    (drive, lib)
}

/// What a two-node all-reduce job whose NCCL fell back to sockets leaves in the job spool,
/// written by the real profiler plugin: `heddle-profiler-drive` loads the built
/// `libheddle_nccl_profiler.so` and plays NCCL's part through its C ABI (a communicator of
/// 4 ranks on 2 nodes, 50 all-reduces of 256 MiB at 2.2369 GB/s, socket network events,
/// finalize), once per local rank, as one Slurm job step. The files are the job user's
/// (this process's). Returns each file's name prefix (`<pid>-`).
fn write_job_spool(dir: &Path) -> Vec<String> {
    let (drive, lib) = profiler_artifacts();
    (0..2)
        .map(|rank| {
            let child = std::process::Command::new(&drive)
                .env("HEDDLE_PROFILER_KERNEL", "1")
                .env("SLURM_JOB_ID", "4242")
                .env("SLURM_STEP_ID", "0")
                .args([
                    "--lib",
                    lib.to_str().unwrap(),
                    "--spool",
                    dir.to_str().unwrap(),
                ])
                .args([
                    "--comm-nranks",
                    "4",
                    "--nnodes",
                    "2",
                    "--rank",
                    &rank.to_string(),
                ])
                .args([
                    "--comm-id",
                    "5eed0fa11bac",
                    "--op",
                    "AllReduce:268435456:50",
                ])
                .args(["--gbps", "2.2369", "--net", "Socket"])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            // The plugin names its file `<pid>-<start ticks>.json`.
            let prefix = format!("{}-", child.id());
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "heddle-profiler-drive: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            prefix
        })
        .collect()
}

/// Spool entries whose names start with one of `prefixes`.
fn spool_files(dir: &Path, prefixes: &[String]) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            prefixes
                .iter()
                .any(|p| name.starts_with(p.as_str()))
                .then(|| dir.join(name))
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
        api.fetch::<NodeDetail>(&format!("/nodes/{HOST}"))
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

    let job: WorkloadSummary = eventually("an observed job that failed", &agent, || async {
        let jobs: Vec<WorkloadSummary> = api.fetch(&format!("/workloads?node={HOST}")).await?;
        // Both ranks' processes: under load the agent may upload the first before the
        // second has written its file.
        jobs.into_iter()
            .find(|j| j.verdict == Verdict::Fail && j.processes == 2)
    })
    .await;
    assert_eq!(job.workload_key, "slurm:4242.0");
    assert_eq!(job.processes, 2);
    assert!(job.finished);
    assert_eq!(job.reasons[0].code.as_deref(), Some("job-socket-fallback"));
    assert!(
        job.reasons[0].message.contains("mlx5"),
        "{}",
        job.reasons[0].message
    );

    let detail: Workload = api.fetch(&format!("/workloads/{}", job.id)).await.unwrap();
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

    let health: NodeHealth = api.fetch(&format!("/nodes/{HOST}/health")).await.unwrap();
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
        spool_files(&spool, &files).is_empty().then_some(())
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
    let jobs: Vec<WorkloadSummary> = api.fetch("/workloads").await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
}
