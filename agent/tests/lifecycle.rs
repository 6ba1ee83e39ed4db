//! The agent's life cycle against a real server and Postgres: the `heddle-agent run`
//! binary is started as a process, killed, restarted; the server is stopped and restarted
//! on the same address and database.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use heddle_server::testing::{TestDb, TestServer};
use heddle_types::auth::AgentInfo;
use heddle_types::jobs::{JobResult, JobState, Outcome, Run};
use heddle_types::nodes::NodeDetail;
use serde_json::json;
use uuid::Uuid;

const HOST: &str = "lifecycle-node";
const WAIT: Duration = Duration::from_secs(45);

/// A `heddle-agent run` process; killed when dropped, its log printed if the test failed.
struct Agent {
    child: Child,
    log: PathBuf,
    state_dir: PathBuf,
}

impl Agent {
    fn start(server_urls: &[&str], token: Option<&str>, state_dir: &Path) -> Agent {
        Agent::start_with(server_urls, token, state_dir, &[])
    }

    fn start_with(server_urls: &[&str], token: Option<&str>, state_dir: &Path, extra: &[&str]) -> Agent {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = state_dir.with_file_name(format!(
            "{}-agent-{n}.log",
            state_dir.file_name().unwrap().to_string_lossy()
        ));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_heddle-agent"));
        cmd.arg("run")
            .args(["--server", &server_urls.join(",")])
            .args(["--state-dir", state_dir.to_str().unwrap()])
            .args(["--hostname", HOST, "--claim-interval", "200ms", "--backoff-cap", "1s"])
            .args(extra)
            .env_remove("HEDDLE_ENROLL_TOKEN")
            .env_remove("HEDDLE_SERVER")
            .env("HEDDLE_LOG", "info,heddle_agent=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        if let Some(t) = token {
            cmd.args(["--enroll-token", t]);
        }
        Agent {
            child: cmd.spawn().expect("starting heddle-agent"),
            log,
            state_dir: state_dir.to_path_buf(),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn spool_entries(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(self.state_dir.join("spool")) else {
            return vec![];
        };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
            .collect();
        v.sort();
        v
    }

    fn identity(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.state_dir.join("identity.json")).unwrap()).unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- agent log {} ----\n{}", self.log.display(), self.log());
        }
    }
}

/// Admin calls to the server's public API.
struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    fn new(server: &TestServer) -> Api {
        Api {
            base: server.url.clone(),
            token: server.admin_token.clone(),
            http: reqwest::Client::new(),
        }
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Option<T> {
        let resp = self
            .http
            .get(format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        resp.json().await.ok()
    }

    async fn send(&self, method: reqwest::Method, path: &str) -> u16 {
        self.http
            .request(method, format!("{}/api/v1{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    async fn run(&self, id: Uuid) -> Option<Run> {
        self.get(&format!("/runs/{id}")).await
    }

    async fn results(&self, id: Uuid) -> Vec<JobResult> {
        self.get(&format!("/runs/{id}/results")).await.unwrap_or_default()
    }

    async fn wait_run(&self, id: Uuid, state: &str, agent: &Agent) -> Run {
        eventually(&format!("run {id} {state}"), agent, || async {
            self.run(id).await.filter(|r| r.state == state)
        })
        .await
    }

    async fn wait_job(&self, id: Uuid, state: JobState, agent: &Agent) -> Run {
        eventually(&format!("job of run {id} {state}"), agent, || async {
            self.run(id).await.filter(|r| r.jobs[0].state == state)
        })
        .await
    }
}

/// Polls `f` until it gives a value; on timeout fails with the agent's log.
async fn eventually<T, F, Fut>(what: &str, agent: &Agent, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > WAIT {
            panic!("timed out waiting for {what} (agent pid {})", agent.pid());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn server(heartbeat_s: u32) -> TestServer {
    TestServer::start_with(|c| c.heartbeat_interval_s = heartbeat_s).await
}

/// Stops `server` but keeps its database, so it can be restarted on the same address.
async fn stop_keeping_db(mut server: TestServer) -> (Arc<TestDb>, String, std::net::SocketAddr) {
    let db = server.db.take().expect("server owns its database");
    let url = server.database_url();
    let addr = server.addr;
    server.stop().await;
    (db, url, addr)
}

async fn restart(db: Arc<TestDb>, url: &str, addr: std::net::SocketAddr, heartbeat_s: u32) -> TestServer {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("re-binding the server address");
    let mut s = TestServer::start_on_listener(url, listener, |c| c.heartbeat_interval_s = heartbeat_s).await;
    s.db = Some(db);
    s
}

/// An agent enrolled and known to the server (its node has facts).
async fn enrolled_agent(server: &TestServer, dir: &Path) -> Agent {
    let token = server.enrollment_token().await;
    let agent = Agent::start(&[&server.url], Some(&token), dir);
    let api = Api::new(server);
    eventually("node with facts", &agent, || async {
        api.get::<NodeDetail>(&format!("/nodes/{HOST}")).await.filter(|n| n.facts.is_some())
    })
    .await;
    agent
}

async fn start_run(server: &TestServer, spec: serde_json::Value) -> Uuid {
    let mut body = spec;
    body["nodes"] = json!([HOST]);
    server.start_run(body).await.id
}

/// Test children of the agent: processes whose parent is `pid` and that run `child`.
fn test_children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
        let (state, ppid) = (fields.first().copied(), fields.get(1).and_then(|s| s.parse::<i32>().ok()));
        if ppid != Some(pid) || state == Some("Z") {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).any(|a| a == b"child") {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enrolls_once_heartbeats_and_reports_facts() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(state.join("identity.json")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "credential file must be private");
    let agent_id: Uuid = agent.identity()["agent_id"].as_str().unwrap().parse().unwrap();

    let node: NodeDetail = api.get(&format!("/nodes/{HOST}")).await.unwrap();
    assert_eq!(node.facts.as_ref().unwrap()["host"]["hostname"], HOST);
    assert_eq!(node.facts_sha256.as_ref().unwrap().len(), 64);

    // Heartbeats keep arriving.
    let first = heartbeat_of(&api, agent_id).await;
    eventually("a later heartbeat", &agent, || async {
        (heartbeat_of(&api, agent_id).await > first).then_some(())
    })
    .await;

    // A restart reuses the stored credential: no second enrollment (which would revoke
    // the first agent), even without a token.
    agent.sigkill();
    let agent = Agent::start(&[&server.url], None, &state);
    let before = heartbeat_of(&api, agent_id).await;
    eventually("heartbeat after restart", &agent, || async {
        (heartbeat_of(&api, agent_id).await > before).then_some(())
    })
    .await;
    let agents: Vec<AgentInfo> = api.get("/agents").await.unwrap();
    assert_eq!(agents.len(), 1, "{agents:?}");
    assert!(agents[0].revoked_at.is_none());
    assert!(agent.log().contains("using the stored credential"));
    // Unchanged facts are not stored again.
    let history: Vec<serde_json::Value> = api.get(&format!("/nodes/{HOST}/facts/history")).await.unwrap();
    assert_eq!(history.len(), 1, "facts history: {history:?}");
}

async fn heartbeat_of(api: &Api, agent_id: Uuid) -> chrono::DateTime<chrono::Utc> {
    let agents: Vec<AgentInfo> = api.get("/agents").await.unwrap();
    agents.iter().find(|a| a.id == agent_id).unwrap().last_heartbeat_at.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcpy_result_arrives_once() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let run = start_run(
        &server,
        json!({"kind": "memcpy", "params": {"min_bytes": 1024, "max_bytes": 1048576, "factor": 4, "iters": 5}}),
    )
    .await;
    api.wait_run(run, "succeeded", &agent).await;
    let results = api.results(run).await;
    assert_eq!(results.len(), 1);
    let r = &results[0];
    assert_eq!(r.outcome, Outcome::Succeeded);
    assert_eq!(r.exit_code, Some(0));
    let sizes: Vec<i64> = r.rows.iter().map(|row| row.size_bytes).collect();
    assert_eq!(sizes, vec![1024, 4096, 16384, 65536, 262144, 1048576]);
    for row in &r.rows {
        let (t, bw) = (row.time_us.unwrap(), row.algbw_gbs.unwrap());
        assert!(t > 0.0 && bw > 0.0);
        assert!((bw - row.size_bytes as f64 / t / 1e3).abs() / bw < 1e-6);
        assert_eq!(row.wrong, Some(0));
    }
    assert_eq!(r.summary["kind"], "memcpy");
    assert!(r.finished_at >= r.started_at);
    eventually("empty spool", &agent, || async { agent.spool_entries().is_empty().then_some(()) }).await;
    // Nothing else arrives later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(api.results(run).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_timeout_and_unknown_kind_are_reported() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);

    let fail = start_run(&server, json!({"kind": "fail", "params": {"message": "link flapped", "exit_code": 7}})).await;
    api.wait_run(fail, "failed", &agent).await;
    let r = &api.results(fail).await[0];
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.exit_code, Some(7));
    assert_eq!(r.reason.as_deref(), Some("exited with status 7: link flapped"));
    assert!(r.stderr_tail.as_deref().unwrap().contains("link flapped"));

    let slow = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 60}, "timeout_s": 1})).await;
    api.wait_run(slow, "failed", &agent).await;
    let r = &api.results(slow).await[0];
    assert_eq!(r.reason.as_deref(), Some("timed out after 1 s"));
    let took = (r.finished_at - r.started_at).to_std().unwrap();
    assert!(took < Duration::from_secs(10), "{took:?}");

    let odd = start_run(&server, json!({"kind": "warp-drive"})).await;
    api.wait_run(odd, "skipped", &agent).await;
    let r = &api.results(odd).await[0];
    assert_eq!(r.outcome, Outcome::Skipped);
    assert_eq!(r.reason.as_deref(), Some("unsupported job kind: warp-drive"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_kills_the_child() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 120}})).await;
    let running = api.wait_job(run, JobState::Running, &agent).await;
    // Progress travels with the renewals.
    eventually("progress", &agent, || async {
        api.run(run).await.and_then(|r| r.jobs[0].progress.clone())
    })
    .await;
    assert!(running.jobs[0].started_at.is_some());
    let children = test_children(agent.pid());
    assert_eq!(children.len(), 1, "one test child expected");

    assert_eq!(api.send(reqwest::Method::POST, &format!("/runs/{run}/cancel")).await, 200);
    api.wait_run(run, "cancelled", &agent).await;
    let results = eventually("cancelled result", &agent, || async {
        let r = api.results(run).await;
        (!r.is_empty()).then_some(r)
    })
    .await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].outcome, Outcome::Cancelled);
    eventually("child gone", &agent, || async { test_children(agent.pid()).is_empty().then_some(()) }).await;
    assert!(!Path::new(&format!("/proc/{}", children[0])).exists() || test_children(agent.pid()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_spooled_while_server_is_down_is_uploaded_once() {
    // A long lease (heartbeat 5 s, lease 7.5 s) so the outage does not requeue the job.
    let server = server(5).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 2}})).await;
    api.wait_job(run, JobState::Running, &agent).await;

    let (db, url, addr) = stop_keeping_db(server).await;
    let spooled = eventually("result spooled", &agent, || async {
        let e = agent.spool_entries();
        (e.len() == 1).then_some(e)
    })
    .await;
    let entry: serde_json::Value = serde_json::from_slice(&std::fs::read(&spooled[0]).unwrap()).unwrap();
    assert_eq!(entry["upload"]["outcome"], "succeeded");
    // Uploads fail for a while; the entry stays.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.spool_entries(), spooled);

    let server = restart(db, &url, addr, 5).await;
    let api2 = Api::new(&server);
    api2.wait_run(run, "succeeded", &agent).await;
    eventually("empty spool", &agent, || async { agent.spool_entries().is_empty().then_some(()) }).await;
    let results = api2.results(run).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].summary["kind"], "sleep");
    assert!(agent.log().contains("result upload failed; it stays spooled"));
    drop(api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_with_a_spooled_result_uploads_it_once_after_restart() {
    let server = server(5).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 1}})).await;
    api.wait_job(run, JobState::Running, &agent).await;

    // The result is spooled while the server is away; then the agent dies.
    let (db, url, addr) = stop_keeping_db(server).await;
    let spooled = eventually("result spooled", &agent, || async {
        let e = agent.spool_entries();
        (e.len() == 1).then_some(e)
    })
    .await;
    let saved = std::fs::read(&spooled[0]).unwrap();
    agent.sigkill();
    assert_eq!(agent.spool_entries(), spooled, "the spool survives SIGKILL");

    let server = restart(db, &url, addr, 5).await;
    let api2 = Api::new(&server);
    let agent = Agent::start(&[&server.url], None, &state);
    api2.wait_run(run, "succeeded", &agent).await;
    eventually("empty spool", &agent, || async { agent.spool_entries().is_empty().then_some(()) }).await;
    assert_eq!(api2.results(run).await.len(), 1);

    // A crash between the server's acknowledgement and the removal of the file means the
    // entry is sent again: its key makes that a no-op.
    drop(agent);
    std::fs::write(&spooled[0], &saved).unwrap();
    let agent = Agent::start(&[&server.url], None, &state);
    eventually("re-sent entry acknowledged", &agent, || async {
        agent.spool_entries().is_empty().then_some(())
    })
    .await;
    assert!(agent.log().contains("result was already stored (retry)"), "{}", agent.log());
    assert_eq!(api2.results(run).await.len(), 1);
    drop(api);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_over_to_a_second_replica() {
    let primary = server(1).await;
    let replica = TestServer::start_on(&primary.database_url(), |c| c.heartbeat_interval_s = 1).await;
    let dir = tempfile::tempdir().unwrap();
    let token = primary.enrollment_token().await;
    let agent = Agent::start(&[&primary.url, &replica.url], Some(&token), &dir.path().join("state"));
    let api = Api::new(&replica);
    eventually("node with facts", &agent, || async {
        api.get::<NodeDetail>(&format!("/nodes/{HOST}")).await.filter(|n| n.facts.is_some())
    })
    .await;
    let db = primary.db.clone();
    primary.stop().await;
    let run = start_run(&replica, json!({"kind": "memcpy", "params": {"max_bytes": 65536}})).await;
    api.wait_run(run, "succeeded", &agent).await;
    assert_eq!(api.results(run).await.len(), 1);
    assert!(agent.log().contains("switched to server replica"));
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_agent_stops_with_status_3() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let agent_id = agent.identity()["agent_id"].as_str().unwrap().to_string();
    assert_eq!(api.send(reqwest::Method::DELETE, &format!("/agents/{agent_id}")).await, 204);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = agent.child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < WAIT, "agent did not stop: {}", agent.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(3), "{}", agent.log());
    assert!(agent.log().contains("refused this agent's credential"), "{}", agent.log());
}

/// Gone, or a zombie nobody reaped yet.
fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => matches!(stat.rsplit(')').next().unwrap_or("").split_whitespace().next(), Some("Z" | "X")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_run_leaves_no_orphan_and_the_job_is_retried() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;
    let api = Api::new(&server);
    let run = start_run(&server, json!({"kind": "sleep", "params": {"seconds": 3}})).await;
    api.wait_job(run, JobState::Running, &agent).await;
    let child = test_children(agent.pid());
    assert_eq!(child.len(), 1);
    agent.sigkill();
    eventually("orphaned child killed", &agent, || async { is_dead(child[0]).then_some(()) }).await;

    // The lease lapses, the job is requeued, and the restarted agent runs it again.
    let agent = Agent::start(&[&server.url], None, &state);
    let done = api.wait_run(run, "succeeded", &agent).await;
    assert_eq!(done.jobs[0].attempts, 2);
    assert_eq!(api.results(run).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_jobs_in_parallel_up_to_the_limit() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let token = server.enrollment_token().await;
    let agent = Agent::start_with(&[&server.url], Some(&token), &dir.path().join("state"), &["--max-parallel", "2"]);
    let api = Api::new(&server);
    eventually("node", &agent, || async { api.get::<NodeDetail>(&format!("/nodes/{HOST}")).await }).await;
    let runs: Vec<Uuid> = start_sleep_runs(&server, 3).await;
    // Two children at once, never three.
    let mut most = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        let n = test_children(agent.pid()).len();
        assert!(n <= 2, "{n} children with --max-parallel 2");
        most = most.max(n);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(most, 2);
    for run in runs {
        api.wait_run(run, "succeeded", &agent).await;
    }
}

async fn start_sleep_runs(server: &TestServer, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(start_run(server, json!({"kind": "sleep", "params": {"seconds": 3}})).await);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_facts_are_sent_again() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    // A copy of a fixture tree stands in for the node, so the test can change it.
    let root = dir.path().join("root");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ethernet-box");
    let cp = Command::new("cp").args(["-a", fixture]).arg(&root).status().unwrap();
    assert!(cp.success());
    let token = server.enrollment_token().await;
    let root_arg = root.to_str().unwrap();
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &dir.path().join("state"),
        &["--facts-root", root_arg, "--facts-interval", "300ms"],
    );
    let api = Api::new(&server);
    let history = |n: usize| {
        let api = &api;
        async move {
            api.get::<Vec<serde_json::Value>>(&format!("/nodes/{HOST}/facts/history"))
                .await
                .filter(|h| h.len() == n)
        }
    };
    eventually("first facts", &agent, || history(1)).await;
    // Re-collections of unchanged facts send nothing new.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(history(1).await.is_some(), "unchanged facts were stored again");

    std::fs::write(root.join("proc/sys/kernel/osrelease"), "6.99.0-heddle-test\n").unwrap();
    eventually("changed facts", &agent, || history(2)).await;
    let node: NodeDetail = api.get(&format!("/nodes/{HOST}")).await.unwrap();
    assert_eq!(node.facts.unwrap()["host"]["kernel"], "6.99.0-heddle-test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_an_unreachable_server_instead_of_exiting() {
    let server = server(1).await;
    let token = server.enrollment_token().await;
    let (db, url, addr) = stop_keeping_db(server).await;
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&[&format!("http://{addr}")], Some(&token), &dir.path().join("state"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(agent.child.try_wait().unwrap().is_none(), "agent exited: {}", agent.log());
    assert!(agent.log().contains("cannot enroll yet"), "{}", agent.log());

    let server = restart(db, &url, addr, 1).await;
    let api = Api::new(&server);
    eventually("node with facts", &agent, || async {
        api.get::<NodeDetail>(&format!("/nodes/{HOST}")).await.filter(|n| n.facts.is_some())
    })
    .await;
}
