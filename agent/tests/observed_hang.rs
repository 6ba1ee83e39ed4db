//! Hung and straggling jobs named while they happen, end to end: the real profiler plugin,
//! driven through its C ABI by `heddle-profiler-drive` as NCCL would, plays the ranks of
//! multi-node jobs on three fake nodes (one real `heddle-agent run` each, with its own job
//! spool), and the real server joins the ranks across nodes and judges them:
//!
//! - a rank that stops calling NCCL while its peers enter the next collective: hung, that
//!   rank the culprit;
//! - a collective every rank entered and none finishes: hung, a stall inside it;
//! - one rank late to every collective: a straggler;
//! - every rank pausing together: nothing;
//! - a rank whose node vanishes (its agent killed) while its peers wait: hung, the rank
//!   named as silent.
//!
//! The server's thresholds are shortened (hung after 4 s, silent after 8 s) so that the
//! test runs in seconds; the times to each verdict are printed.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use heddle_server::testing::TestServer;
use heddle_types::observed::{Workload, WorkloadSummary};

mod lifecycle_support;
use lifecycle_support::*;

const NODES: [&str; 3] = ["hang-a", "hang-b", "hang-c"];

fn profiler_artifacts() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let (drive, lib) = (
        dir.join("heddle-profiler-drive"),
        dir.join("libheddle_nccl_profiler.so"),
    );
    assert!(
        drive.is_file() && lib.is_file(),
        "build them first: cargo build -p heddle-nccl-profiler"
    );
    (drive, lib)
}

/// One rank of Slurm job `job`: a 3-rank communicator over sockets, rank `rank` on its
/// node's spool; `extra` are the drive's schedule flags.
fn rank(spool: &Path, job: &str, rank: u32, extra: &[&str]) -> Child {
    let (drive, lib) = profiler_artifacts();
    Command::new(drive)
        .env("SLURM_JOB_ID", job)
        .env("HEDDLE_PROFILER_INTERVAL_S", "0.5")
        .env("HEDDLE_PROFILER_STALL_S", "1")
        .env("HEDDLE_PROFILER_KERNEL", "0")
        .args([
            "--lib",
            lib.to_str().unwrap(),
            "--spool",
            spool.to_str().unwrap(),
        ])
        .args([
            "--comm-nranks",
            "3",
            "--nnodes",
            "3",
            "--rank",
            &rank.to_string(),
        ])
        .args(["--comm-id", &format!("{job}ab"), "--net", "Socket"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The job's row on `node` once `pred` holds for it, and the seconds since `fault_ms`;
/// on a timeout, fails with the rows and ranks the server last had.
async fn until(
    api: &Api,
    agent: &Agent,
    (node, job, fault_ms): (&str, &str, u64),
    what: &str,
    pred: impl Fn(&WorkloadSummary) -> bool,
) -> (WorkloadSummary, f64) {
    let key = format!("slurm:{job}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let jobs: Vec<WorkloadSummary> = api
            .fetch(&format!("/workloads?node={node}"))
            .await
            .unwrap_or_default();
        let row = jobs.into_iter().find(|j| j.workload_key == key);
        if let Some(j) = row.as_ref().filter(|j| pred(j)) {
            return (j.clone(), now_ms().saturating_sub(fault_ms) as f64 / 1000.0);
        }
        if std::time::Instant::now() > deadline {
            let ranks = match &row {
                Some(j) => api
                    .fetch::<Workload>(&format!("/workloads/{}", j.id))
                    .await
                    .map(|d| d.ranks),
                None => None,
            };
            panic!(
                "timed out waiting for {what} (agent pid {}): row {row:#?}\nranks {ranks:#?}\n{}",
                agent.pid(),
                agent.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn has(j: &WorkloadSummary, code: &str) -> bool {
    j.reasons.iter().any(|r| r.code.as_deref() == Some(code))
}

fn message<'a>(j: &'a WorkloadSummary, code: &str) -> &'a str {
    j.reasons
        .iter()
        .find(|r| r.code.as_deref() == Some(code))
        .map_or("", |r| r.message.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_and_straggling_jobs_are_named_across_nodes() {
    let server = TestServer::start_with(|c| {
        c.heartbeat_interval_s = 1;
        c.job_hung_s = 4.0;
        c.job_silent_s = 8.0;
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (spools, mut agents) = three_nodes_with_job_spools(&server, dir.path()).await;
    let api = Api::new(&server);
    let mut children = Vec::new();
    let (t0, fault) = jobs_101_to_104_started(&spools, &mut children);
    a_rank_that_stopped_is_named(&api, &agents, fault).await;
    a_collective_nobody_finishes_is_named(&api, &agents, fault).await;
    a_late_rank_is_named_a_straggler(&api, &agents, t0).await;
    ranks_pausing_together_are_nothing(&api, &agents, t0).await;
    a_rank_whose_node_vanished_is_named(&api, &mut agents, &spools, &mut children).await;
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// One `heddle-agent run` per node, each with its own job spool; returns the spools and
/// the agents once every spool is there.
async fn three_nodes_with_job_spools(
    server: &TestServer,
    dir: &Path,
) -> (Vec<PathBuf>, Vec<Agent>) {
    // One enrollment token per node: a token enrolls one agent.
    let mut tokens = Vec::new();
    for _ in NODES {
        tokens.push(server.enrollment_token().await);
    }
    let spools: Vec<PathBuf> = NODES.iter().map(|n| dir.join(n).join("jobs")).collect();
    let agents: Vec<Agent> = NODES
        .iter()
        .zip(&spools)
        .zip(&tokens)
        .map(|((n, spool), token)| {
            std::fs::create_dir_all(dir.join(n)).unwrap();
            Agent::start_named(
                n,
                &[&server.url],
                Some(token),
                &dir.join(n).join("state"),
                &[
                    "--job-spool",
                    spool.to_str().unwrap(),
                    "--job-spool-interval",
                    "300ms",
                ],
            )
        })
        .collect();
    for (a, spool) in agents.iter().zip(&spools) {
        eventually("the job spool", a, || async {
            spool.is_dir().then_some(())
        })
        .await;
    }
    (spools, agents)
}

/// The drive's flags for all-reduces every 50 ms from `start` (ms since the epoch).
fn every_50_ms(start: &str, ops: &str) -> Vec<String> {
    vec![
        "--start-at-ms".to_string(),
        start.to_string(),
        "--period-ms".into(),
        "50".into(),
        "--op".into(),
        ops.to_string(),
    ]
}

fn args(v: &[String], more: &[&str]) -> Vec<String> {
    v.iter()
        .cloned()
        .chain(more.iter().map(|s| s.to_string()))
        .collect()
}

/// Starts rank `r` of `job` on node `r`'s spool with the drive's flags `a`.
fn run_rank(children: &mut Vec<Child>, spools: &[PathBuf], job: &str, r: usize, a: Vec<String>) {
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    children.push(rank(&spools[r], job, r as u32, &refs));
}

/// Jobs 101 to 104, each a 3-rank communicator across the nodes. Returns when they start
/// and when the 21st all-reduce, where 101 and 102 hang, starts (ms since the epoch).
fn jobs_101_to_104_started(spools: &[PathBuf], children: &mut Vec<Child>) -> (u64, u64) {
    let t0 = now_ms() + 1500;
    let start = t0.to_string();
    // The 21st all-reduce, where jobs 101 and 102 hang, starts 20 periods in.
    let fault = t0 + 20 * 50;
    let sched = |ops: &str| every_50_ms(&start, ops);
    let run = |children: &mut Vec<Child>, job: &str, r: usize, a: Vec<String>| {
        run_rank(children, spools, job, r, a)
    };
    // 101: rank 1 stops after 20 all-reduces; ranks 0 and 2 enter the 21st, which cannot end.
    for r in [0, 2] {
        run(
            children,
            "101",
            r,
            args(
                &sched("AllReduce:1048576:21"),
                &["--hang-last", "--linger-s", "40"],
            ),
        );
    }
    run(
        children,
        "101",
        1,
        args(&sched("AllReduce:1048576:20"), &["--linger-s", "40"]),
    );
    // 102: every rank enters the 21st and none finishes it.
    for r in 0..3 {
        run(
            children,
            "102",
            r,
            args(
                &sched("AllReduce:1048576:21"),
                &["--hang-last", "--linger-s", "40"],
            ),
        );
    }
    // 103: rank 2 is 150 ms late to each of 40 all-reduces, 200 ms apart.
    for r in 0..3 {
        let late = if r == 2 { "150" } else { "0" };
        let a = vec![
            "--start-at-ms".to_string(),
            start.clone(),
            "--period-ms".into(),
            "200".into(),
            "--late-ms".into(),
            late.into(),
            "--op".into(),
            "AllReduce:1048576:40".into(),
            "--linger-s".into(),
            "2".into(),
        ];
        run(children, "103", r, a);
    }
    // 104: every rank pauses 15 s after 20 all-reduces (a checkpoint), then goes on.
    for r in 0..3 {
        run(
            children,
            "104",
            r,
            args(&sched("AllReduce:1048576:20"), &["--linger-s", "15"]),
        );
    }
    (t0, fault)
}

/// 101: rank 1 stopped; ranks 0 and 2 wait in the 21st all-reduce.
async fn a_rank_that_stopped_is_named(api: &Api, agents: &[Agent], fault: u64) {
    let (j, took) = until(
        api,
        &agents[0],
        ("hang-a", "101", fault),
        "job 101 hung",
        |j| has(j, "job-hung"),
    )
    .await;
    let m = message(&j, "job-hung");
    assert!(
        m.contains("rank 1 on hang-b never entered it (last started #20"),
        "{m}"
    );
    assert!(m.contains("#21"), "{m}");
    eprintln!("a rank that stopped: named {took:.1} s after it: {m}");
    let detail: Workload = api.fetch(&format!("/workloads/{}", j.id)).await.unwrap();
    let culprits: Vec<(u32, &str)> = detail
        .ranks
        .iter()
        .filter(|r| r.culprit)
        .map(|r| (r.rank, r.hostname.as_str()))
        .collect();
    assert_eq!(culprits, [(1, "hang-b")], "{:?}", detail.ranks);
    assert_eq!(detail.ranks.len(), 3);
    // Every node's row of the job says so.
    let (j, _) = until(
        api,
        &agents[1],
        ("hang-b", "101", fault),
        "job 101 hung on hang-b",
        |j| has(j, "job-hung"),
    )
    .await;
    assert_eq!(j.verdict, heddle_types::health::Verdict::Fail);
}

/// 102: every rank entered the 21st all-reduce and none finishes it.
async fn a_collective_nobody_finishes_is_named(api: &Api, agents: &[Agent], fault: u64) {
    let (j, took) = until(
        api,
        &agents[0],
        ("hang-a", "102", fault),
        "job 102 hung",
        |j| has(j, "job-hung"),
    )
    .await;
    let m = message(&j, "job-hung");
    assert!(
        m.contains("every rank entered AllReduce #21") && m.contains("stall inside"),
        "{m}"
    );
    eprintln!("a collective nobody finishes: named {took:.1} s after it started: {m}");
}

/// 103: rank 2 is late to every all-reduce.
async fn a_late_rank_is_named_a_straggler(api: &Api, agents: &[Agent], t0: u64) {
    let (j, took) = until(
        api,
        &agents[2],
        ("hang-c", "103", t0),
        "job 103 straggling",
        |j| has(j, "job-straggler"),
    )
    .await;
    let m = message(&j, "job-straggler");
    assert!(m.contains("rank 2 on hang-c arrived last"), "{m}");
    assert!(!has(&j, "job-hung"), "{j:?}");
    eprintln!("a straggler: named {took:.1} s after the job started: {m}");
}

/// 104 paused together: seen, judged, never hung nor straggling, through its pause.
async fn ranks_pausing_together_are_nothing(api: &Api, agents: &[Agent], t0: u64) {
    let (j, _) = until(
        api,
        &agents[0],
        ("hang-a", "104", t0),
        "job 104 judged",
        |j| j.communicators == 1,
    )
    .await;
    assert!(!has(&j, "job-hung") && !has(&j, "job-straggler"), "{j:?}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let jobs: Vec<WorkloadSummary> = api.fetch("/workloads?node=hang-a").await.unwrap();
    let paused = jobs.iter().find(|j| j.workload_key == "slurm:104").unwrap();
    assert!(
        !has(paused, "job-hung") && !has(paused, "job-straggler"),
        "{paused:?}"
    );
}

/// 105: rank 2's node vanishes after 20 all-reduces (its agent and its process are
/// killed) while ranks 0 and 1 enter the 21st.
async fn a_rank_whose_node_vanished_is_named(
    api: &Api,
    agents: &mut Vec<Agent>,
    spools: &[PathBuf],
    children: &mut Vec<Child>,
) {
    let t1 = now_ms() + 1000;
    let start = t1.to_string();
    let sched = |ops: &str| every_50_ms(&start, ops);
    let run = |children: &mut Vec<Child>, job: &str, r: usize, a: Vec<String>| {
        run_rank(children, spools, job, r, a)
    };
    for r in [0, 1] {
        run(
            children,
            "105",
            r,
            args(
                &sched("AllReduce:1048576:21"),
                &["--hang-last", "--linger-s", "40"],
            ),
        );
    }
    let mut gone = rank(
        &spools[2],
        "105",
        2,
        &sched("AllReduce:1048576:20")
            .iter()
            .map(String::as_str)
            .chain(["--linger-s", "40"])
            .collect::<Vec<_>>(),
    );
    // Once the server holds rank 2's last report, its node goes.
    until(
        api,
        &agents[2],
        ("hang-c", "105", t1),
        "rank 2 of job 105 reported",
        |j| j.communicators == 1 && j.processes == 1,
    )
    .await;
    // Its last report (all 20 collectives) is in: let the next upload carry it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = gone.kill();
    let _ = gone.wait();
    let c = agents.remove(2);
    drop(c);
    let (j, took) = until(
        api,
        &agents[0],
        ("hang-a", "105", t1 + 20 * 50),
        "job 105 hung",
        |j| has(j, "job-hung") && message(j, "job-hung").contains("no report for"),
    )
    .await;
    let m = message(&j, "job-hung");
    assert!(m.contains("rank 2 on hang-c never entered it"), "{m}");
    eprintln!("a rank whose node vanished: named {took:.1} s after its peers entered #21: {m}");
}
