//! Shared by the tests that run the agent: a `heddle-agent run` process, a server to run it
//! against, and waiting on what the agent does (the test kit's `Api` asks the server).
//! Each test binary uses a subset, hence `dead_code`.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub use heddle_testkit::Api;
use heddle_testkit::{TestDb, TestServer};
use heddle_types::jobs::{JobState, Run};
use heddle_types::nodes::NodeDetail;
use serde_json::json;
use uuid::Uuid;

pub const HOST: &str = "lifecycle-node";
pub const WAIT: Duration = Duration::from_secs(45);

/// A `heddle-agent run` process; killed when dropped, its log printed if the test failed.
pub struct Agent {
    pub child: Child,
    pub log: PathBuf,
    pub state_dir: PathBuf,
}

impl Agent {
    pub fn start(server_urls: &[&str], token: Option<&str>, state_dir: &Path) -> Agent {
        Agent::start_with(server_urls, token, state_dir, &[])
    }

    pub fn start_with(
        server_urls: &[&str],
        token: Option<&str>,
        state_dir: &Path,
        extra: &[&str],
    ) -> Agent {
        Agent::start_named(HOST, server_urls, token, state_dir, extra)
    }

    /// An agent that reports itself as `hostname` (several nodes on one machine).
    pub fn start_named(
        hostname: &str,
        server_urls: &[&str],
        token: Option<&str>,
        state_dir: &Path,
        extra: &[&str],
    ) -> Agent {
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
            .args([
                "--hostname",
                hostname,
                "--claim-interval",
                "200ms",
                "--backoff-cap",
                "1s",
            ])
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

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    pub fn spool_entries(&self) -> Vec<PathBuf> {
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

    pub fn identity(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.state_dir.join("identity.json")).unwrap())
            .unwrap()
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

/// Waiting on a run while a `heddle-agent` process works on it.
pub trait RunWaits {
    async fn wait_run(&self, id: Uuid, state: &str, agent: &Agent) -> Run;
    async fn wait_job(&self, id: Uuid, state: JobState, agent: &Agent) -> Run;
}

impl RunWaits for Api {
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
pub async fn eventually<T>(what: &str, agent: &Agent, f: impl AsyncFnMut() -> Option<T>) -> T {
    heddle_testkit::eventually(&format!("{what} (agent pid {})", agent.pid()), WAIT, f).await
}

pub async fn server(heartbeat_s: u32) -> TestServer {
    TestServer::start_with(|c| c.heartbeat_interval_s = heartbeat_s).await
}

/// Stops `server` but keeps its database, so it can be restarted on the same address.
pub async fn stop_keeping_db(
    mut server: TestServer,
) -> (Arc<TestDb>, String, std::net::SocketAddr) {
    let db = server.db.take().expect("server owns its database");
    let url = server.database_url();
    let addr = server.addr;
    server.stop().await;
    (db, url, addr)
}

pub async fn restart(
    db: Arc<TestDb>,
    url: &str,
    addr: std::net::SocketAddr,
    heartbeat_s: u32,
) -> TestServer {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("re-binding the server address");
    let mut s =
        TestServer::start_on_listener(url, listener, |c| c.heartbeat_interval_s = heartbeat_s)
            .await;
    s.db = Some(db);
    s
}

/// An agent enrolled and known to the server (its node has facts).
pub async fn enrolled_agent(server: &TestServer, dir: &Path) -> Agent {
    let token = server.enrollment_token().await;
    let agent = Agent::start(&[&server.url], Some(&token), dir);
    let api = Api::new(server);
    eventually("node with facts", &agent, || async {
        api.fetch::<NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| n.facts.is_some())
    })
    .await;
    agent
}

pub async fn start_run(server: &TestServer, spec: serde_json::Value) -> Uuid {
    let mut body = spec;
    body["nodes"] = json!([HOST]);
    server.start_run(body).await.id
}

/// Test children of the agent: processes whose parent is `pid` and that run `child`.
pub fn test_children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let (state, ppid) = (
            fields.first().copied(),
            fields.get(1).and_then(|s| s.parse::<i32>().ok()),
        );
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
