//! The dashboard in headless Chromium (driven through chromedriver) against a real server on
//! a real Postgres, with data seeded through the API and a fake agent that claims jobs and
//! uploads results over the agent protocol. It walks what a person does: sign in, read the
//! fleet, open a node and its topology heatmap, launch a run from the form built from the
//! run-kinds catalogue (a refused parameter shown beside it) and watch it finish, upload a
//! plugin and dry-run it, create an enrollment token (those steps in `dashboard/walk.rs`),
//! open a sweep, a p2p matrix and an investigation (`dashboard/pages.rs`), and sign in
//! again as a viewer. A second test opens the regressions page with a regression made
//! from simulated weeks of results (`dashboard/regressions.rs`); a third the fabric page
//! after a fabric investigation found a hung leaf (`dashboard/fabric.rs`).
//!
//! Needs `frontend/dist` (scripts/build-frontend.sh), `plugins/dist` (scripts/build-plugins.sh),
//! `chromium` and `chromium-driver` from apt, and `HEDDLE_TEST_DATABASE_URL`. Screenshots of
//! every page are written under cargo's test tmp dir; the path is printed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use heddle_server::testing::TestServer;
use heddle_testkit::Api;
use heddle_testkit::files::fixture_facts as fixture;
use serde_json::{Value, json};

#[path = "dashboard/browser.rs"]
mod browser;
#[path = "dashboard/fabric.rs"]
mod fabric;
#[path = "dashboard/pages.rs"]
mod pages;
#[path = "dashboard/regressions.rs"]
mod regressions;
#[path = "dashboard/walk.rs"]
mod walk;

use browser::*;
use walk::*;

struct Shots(PathBuf);

impl Shots {
    async fn take(&self, c: &Client, name: &str) {
        let png = c.screenshot().await.unwrap();
        std::fs::write(self.0.join(format!("{name}.png")), png).unwrap();
    }
}

/// Enrolls an agent for `hostname` and, when given, sends its facts.
async fn enroll(api: &Api, server: &TestServer, hostname: &str, facts: Option<Value>) -> String {
    let token = server.enrollment_token().await;
    let body = json!({"enroll_token": token, "hostname": hostname, "agent_version": "0.1.0"});
    let (status, enrolled) = api
        .call(
            reqwest::Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(body),
        )
        .await;
    assert_eq!(status, 201);
    let credential = enrolled["credential"].as_str().unwrap().to_string();
    if let Some(f) = facts {
        api.ok(
            reqwest::Method::PUT,
            "/api/v1/agent/facts",
            Some(&credential),
            Some(f),
        )
        .await;
    }
    credential
}

fn plugin_path(name: &str) -> PathBuf {
    let p = repo().join("plugins/dist").join(format!("{name}.wasm"));
    assert!(
        p.is_file(),
        "{} is missing: run scripts/build-plugins.sh",
        p.display()
    );
    p.canonicalize().unwrap()
}

/// nccl-tests style rows from 8 B to 1 GiB whose bus bandwidth saturates at `peak` GB/s.
fn nccl_rows(peak: f64) -> Value {
    let rows: Vec<Value> = (3..=30)
        .map(|e| {
            let size = 1i64 << e;
            let busbw = peak * size as f64 / (size as f64 + 4.0 * 1048576.0);
            let algbw = busbw / 1.75;
            json!({"size_bytes": size, "count": size / 4, "dtype": "float", "op": "sum", "root": -1, "in_place": false,
                   "time_us": size as f64 / (algbw.max(1e-3) * 1e3), "algbw_gbs": algbw, "busbw_gbs": busbw, "wrong": 0})
        })
        .collect();
    Value::Array(rows)
}

/// A fake agent: heartbeats, claims jobs, reports progress twice a second apart and uploads
/// nccl rows, each job a little faster than the one before so overlaid runs differ.
async fn agent_loop(base: String, credential: String, mut peak: f64) {
    let http = reqwest::Client::new();
    loop {
        let _ = http
            .post(format!("{base}/api/v1/agent/heartbeat"))
            .bearer_auth(&credential)
            .json(&json!({}))
            .send()
            .await;
        let resp = http
            .post(format!("{base}/api/v1/agent/jobs/claim"))
            .bearer_auth(&credential)
            .send()
            .await;
        let Ok(resp) = resp else { return };
        if resp.status() != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let lease: Value = resp.json().await.unwrap();
        let job = lease["job_id"].as_str().unwrap().to_string();
        let started = chrono::Utc::now();
        for (fraction, msg) in [(0.3, "size 64 MiB"), (0.7, "size 512 MiB")] {
            let body = json!({"progress": {"fraction": fraction, "message": msg}});
            let _ = http
                .post(format!("{base}/api/v1/agent/jobs/{job}/renew"))
                .bearer_auth(&credential)
                .json(&body)
                .send()
                .await;
            tokio::time::sleep(Duration::from_millis(1200)).await;
        }
        let result = json!({"upload_key": format!("k-{job}"), "outcome": "succeeded", "summary": {"nccl": "2.21.5", "transport": "IB"},
            "rows": pages::rows_for(&lease["spec"], peak), "started_at": started, "finished_at": chrono::Utc::now()});
        peak += 12.0;
        let r = http
            .post(format!("{base}/api/v1/agent/jobs/{job}/result"))
            .bearer_auth(&credential)
            .json(&result)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "result upload: {}", r.status());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_end_to_end_in_chromium() {
    let dist = dashboard_dist();
    let runai = plugin_path("runai-roce");
    let server = TestServer::start_with(|c| c.dashboard_dir = Some(dist.clone())).await;
    let admin = server.admin_token.clone();
    let api = Api::new(&server);
    let shots = Shots(Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots"));
    std::fs::create_dir_all(&shots.0).unwrap();
    let (nd, worker) = seed(&server, &api, &admin).await;

    let (_driver, c) = browser().await;
    let w = Walk {
        server: &server,
        api: &api,
        admin: &admin,
        c: &c,
        shots: &shots,
    };
    sign_in(&w).await;
    fleet_page(&w).await;
    node_page(&w).await;
    launch_a_run_and_watch_it(&w).await;
    upload_and_dry_run_a_plugin(&w, &runai).await;
    agents_page(&w).await;
    pages::sweeps_p2p_investigations(&c, &server, &api, &shots, vec![nd, worker]).await;
    a_viewer_sees_no_actions(&w).await;

    println!("dashboard screenshots: {}", shots.0.display());
    c.close().await.unwrap();
}

/// What the steps in the browser share: the server, its API, the browser and where the
/// screenshots go.
struct Walk<'a> {
    server: &'a TestServer,
    api: &'a Api,
    admin: &'a str,
    c: &'a Client,
    shots: &'a Shots,
}

/// Seed: three nodes from plugin fixtures, one agent that never sent facts, two enabled
/// plugins, and a finished baseline run on dgx15 to overlay later. Returns the
/// credentials of two of the nodes.
async fn seed(server: &TestServer, api: &Api, admin: &str) -> (String, String) {
    let dgx = enroll(api, server, "dgx15", Some(fixture("dgx1"))).await;
    let nd = enroll(api, server, "nd40rs-v2-0", Some(fixture("azure-nd40rs-v2"))).await;
    let worker = enroll(
        api,
        server,
        "my-first-distributed-app-worker-0",
        Some(fixture("runai-roce")),
    )
    .await;
    enroll(api, server, "gpu-new-7", None).await;
    for name in ["dgx-affinity", "azure-nd"] {
        let bytes = std::fs::read(plugin_path(name)).unwrap();
        let r = api
            .http
            .post(format!("{}/api/v1/plugins/{name}/versions/0.1.0", api.base))
            .bearer_auth(admin)
            .header("content-type", "application/wasm")
            .body(bytes)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "uploading {name}: {}",
            r.text().await.unwrap()
        );
        api.ok(
            reqwest::Method::POST,
            &format!("/api/v1/plugins/{name}/enable"),
            Some(admin),
            Some(json!({})),
        )
        .await;
    }
    tokio::spawn(agent_loop(server.url.clone(), dgx.clone(), 170.0));
    let baseline = server.start_run(json!({"kind": "nccl", "nodes": ["dgx15"], "label": "baseline", "params": {"op": "all_reduce"}})).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.get_run(baseline.id).await.state != "succeeded" {
        assert!(Instant::now() < deadline, "the baseline run did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The reconciler applies enabled plugins in the background; wait for dgx15's env.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let node = api
            .ok(
                reqwest::Method::GET,
                "/api/v1/nodes/dgx15",
                Some(admin),
                None,
            )
            .await;
        if node["recommendations"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no plugin recommendation reached dgx15: {node}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (nd, worker)
}

/// A server that serves the built dashboard, and its API.
async fn dashboard_server() -> (TestServer, Api) {
    let dist = dashboard_dist();
    let server = TestServer::start_with(|c| c.dashboard_dir = Some(dist.clone())).await;
    let api = Api::new(&server);
    (server, api)
}

/// The screenshot folder, and a browser signed in to `server`'s dashboard as the admin.
async fn signed_in(server: &TestServer) -> (Shots, browser::Driver, Client) {
    let shots = Shots(Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots"));
    std::fs::create_dir_all(&shots.0).unwrap();
    let (driver, c) = browser().await;
    sign_in_as_admin(&c, &server.url, &server.admin_token).await;
    (shots, driver, c)
}

/// A regression made through the agent protocol, read on the regressions page, its series
/// view and the node's page (`dashboard/regressions.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regressions_page_in_chromium() {
    let (server, api) = dashboard_server().await;
    let (shots, _driver, c) = signed_in(&server).await;
    regressions::regressions_page(&c, &server, &api, &shots).await;
    c.close().await.unwrap();
}

/// A fabric investigation run by simulated agents over a generated fat tree with a hung
/// leaf: the fabric page draws the tree with that leaf marked, and the investigation's
/// page names it (`dashboard/fabric.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_page_marks_the_blamed_leaf_in_chromium() {
    let (server, api) = dashboard_server().await;
    let (shots, _driver, c) = signed_in(&server).await;
    fabric::fabric_page(&c, &server, &api, &shots).await;
    c.close().await.unwrap();
}

/// A hung job, played over the agent protocol by two nodes (rank 0 on `lane-a` waiting 20 s
/// in collective #41, rank 1 on `lane-b` stopped after #40): its page shows every rank as a
/// lane, the culprit marked with its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_job_page_marks_the_culprit_in_chromium() {
    use heddle_server::testing::spool::{rank_file, upload};
    let (server, api) = dashboard_server().await;
    let a = enroll(&api, &server, "lane-a", None).await;
    let b = enroll(&api, &server, "lane-b", None).await;
    let post = |cred: String, body: Value| {
        let api = &api;
        async move {
            api.ok(
                reqwest::Method::POST,
                "/api/v1/agent/observations",
                Some(&cred),
                Some(body),
            )
            .await
        }
    };
    let a2 = a.clone();
    post(a, upload(&[rank_file("31", 1000, 100, 0, 41, false, 20)])).await;
    post(b, upload(&[rank_file("31", 1000, 200, 1, 40, true, 21)])).await;
    let jobs = api
        .ok(
            reqwest::Method::GET,
            "/api/v1/workloads?node=lane-a",
            Some(&server.admin_token),
            None,
        )
        .await;
    let id = jobs[0]["id"].as_str().unwrap().to_string();

    let (shots, _driver, c) = signed_in(&server).await;
    c.goto(&format!("{}/workloads/{id}", server.url))
        .await
        .unwrap();
    wait_text(&c, "#workload-reasons", "job-hung").await;
    wait_text(&c, "#workload-ranks", "rank 1 · lane-b").await;
    let culprit = c
        .find(Locator::Css("#workload-ranks .lane.culprit"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        culprit.contains("lane-b") && culprit.contains("culprit"),
        "{culprit}"
    );
    let lanes = c
        .find_all(Locator::Css("#workload-ranks .lane"))
        .await
        .unwrap()
        .len();
    assert_eq!(lanes, 2, "one lane a rank");
    shots.take(&c, "13-job-hung").await;

    // A communicator hash is what the job's user wrote: any visible characters, cut at 8
    // characters, not bytes (the page once sliced it at byte 8, inside the "é").
    let mut wide = rank_file("32", 1000, 300, 0, 41, false, 20);
    wide.comms[0].comm_hash = "c0ffeeeéé9".into();
    wide.comms[0].nranks = 1;
    wide.comms[0].nnodes = 1;
    post(a2, upload(&[wide])).await;
    let jobs = api
        .ok(
            reqwest::Method::GET,
            "/api/v1/workloads?node=lane-a",
            Some(&server.admin_token),
            None,
        )
        .await;
    let wide_id = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_key"] == "slurm:32")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The page's first address, /jobs/{id}, still shows it.
    c.goto(&format!("{}/jobs/{wide_id}", server.url))
        .await
        .unwrap();
    wait_text(&c, "#workload-ranks", "c0ffeeeé rank 0 · lane-a").await;
    c.close().await.unwrap();
}
