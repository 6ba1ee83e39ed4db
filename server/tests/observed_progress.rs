//! Observed jobs' ranks judged across nodes through the API: a hung job names the rank that
//! never entered the collective (on another node), and the attacks a job's user can make
//! with the files they write: blaming another owner's job or node, forging impossible
//! progress, and growing the server's work on one job without bound.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use heddle_server::testing::TestServer;
use heddle_server::testing::spool::{rank_file, upload};
use heddle_types::observe::SpoolFile;
use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;
use common::*;

async fn job(api: &Api, server: &TestServer, node: &str, key: &str, uid: u64) -> Value {
    let (_, jobs) = api
        .get(
            &format!("/api/v1/workloads?node={node}"),
            &server.admin_token,
        )
        .await;
    let j = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_key"] == key && j["uid"] == uid)
        .unwrap_or_else(|| panic!("no {key} of {uid} on {node}: {jobs}"))
        .clone();
    let (_, detail) = api
        .get(
            &format!("/api/v1/workloads/{}", j["id"].as_str().unwrap()),
            &server.admin_token,
        )
        .await;
    detail
}

fn codes(job: &Value) -> Vec<String> {
    job["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["code"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn ranks_join_across_nodes_within_one_owner_only() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let a = enroll(&api, &server, "prog-a").await;
    let b = enroll(&api, &server, "prog-b").await;
    let post = |cred: &str, body: Value| {
        let cred = cred.to_string();
        let api = &api;
        async move { api.post("/api/v1/agent/observations", &cred, body).await }
    };

    // Job 9 of user 1000: rank 0 on prog-a has waited 20 s in #41; rank 1 on prog-b never
    // entered it. Judged across the two nodes: hung, rank 1 on prog-b the culprit.
    let (s, b0) = post(
        &a.credential,
        upload(&[rank_file("9", 1000, 100, 0, 41, false, 20)]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b0}");
    post(
        &b.credential,
        upload(&[rank_file("9", 1000, 200, 1, 40, true, 21)]),
    )
    .await;
    for node in ["prog-a", "prog-b"] {
        let j = job(&api, &server, node, "slurm:9", 1000).await;
        assert_eq!(j["verdict"], "fail", "{j}");
        assert_eq!(codes(&j)[0], "job-hung", "{j}");
        let m = j["reasons"][0]["message"].as_str().unwrap();
        assert!(
            m.contains("rank 1 on prog-b never entered it (last started #40"),
            "{m}"
        );
        let ranks = j["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{j}");
        assert_eq!(ranks[1]["culprit"], true);
        assert_eq!(ranks[1]["hostname"], "prog-b");
    }

    // Attack: user 2000 on prog-b writes a file naming the same Slurm job, communicator and
    // rank, far behind, to have user 1000's job (or prog-b) blamed for it. It is another
    // job: user 1000's verdict still names its own rank 1 only, and user 2000's job (one
    // rank, nothing to wait for) is not hung.
    post(
        &b.credential,
        upload(&[rank_file("9", 2000, 300, 1, 3, true, 60)]),
    )
    .await;
    let j = job(&api, &server, "prog-a", "slurm:9", 1000).await;
    let m = j["reasons"][0]["message"].as_str().unwrap();
    assert!(m.contains("last started #40"), "{m}");
    assert!(!m.contains("#3,"), "{m}");
    let other = job(&api, &server, "prog-b", "slurm:9", 2000).await;
    assert!(!codes(&other).contains(&"job-hung".to_string()), "{other}");
    // A process-keyed job (no scheduler) is joined within its node only: the same pid and
    // start on another node is another process.
    let mut lone = rank_file("x", 1000, 500, 0, 41, false, 20);
    lone.job.slurm_job_id = None;
    let mut twin = rank_file("x", 1000, 500, 1, 40, true, 21);
    twin.job.slurm_job_id = None;
    post(&a.credential, upload(&[lone])).await;
    post(&b.credential, upload(&[twin])).await;
    let j = job(&api, &server, "prog-a", "pid:500@7", 1000).await;
    let m = j["reasons"][0]["message"].as_str().unwrap_or_default();
    assert!(!m.contains("prog-b"), "{j}");
    assert_eq!(j["ranks"].as_array().unwrap().len(), 1, "{j}");

    // Attack: impossible progress is refused whole, before anything is stored.
    let mut forged = rank_file("10", 1000, 101, 0, 5, false, 1);
    forged.comms[0].progress.as_mut().unwrap().coll_done = 9;
    let mut clock = rank_file("10", 1000, 101, 0, 5, false, 1);
    clock.comms[0].progress.as_mut().unwrap().clock = "monotonic".into();
    let mut arrivals = rank_file("10", 1000, 101, 0, 5, false, 1);
    arrivals.comms[0].progress.as_mut().unwrap().arrivals = vec![[1, 1]; 129];
    for (what, f) in [
        ("done beyond started", forged),
        ("another clock", clock),
        ("129 arrivals", arrivals),
    ] {
        let (s, body) = post(&a.credential, upload(&[f])).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
    }

    // Attack: a job that claims a communicator of 2^30 ranks is judged in bounded time
    // and names at most 16 missing ranks.
    let mut wide = rank_file("11", 1000, 102, 0, 41, false, 20);
    wide.comms[0].nranks = 1 << 30;
    post(&a.credential, upload(&[wide])).await;
    let j = job(&api, &server, "prog-a", "slurm:11", 1000).await;
    let m = j["reasons"][0]["message"].as_str().unwrap();
    assert_eq!(m.matches("never reported").count(), 16, "{m}");
}

#[tokio::test]
async fn a_job_holds_a_bounded_number_of_rows() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let a = enroll(&api, &server, "rows-a").await;
    // 64 processes of 64 communicators each: 4,096 rows, the most one job may hold.
    let file = |pid: u32| {
        let mut f = rank_file("12", 1000, pid, 0, 2, true, 1);
        let c = f.comms[0].clone();
        f.comms = (0..64)
            .map(|i| {
                let mut c = c.clone();
                c.comm_hash = format!("c{i:04}");
                c
            })
            .collect();
        f
    };
    let batch: Vec<SpoolFile> = (0..64).map(|p| file(1000 + p)).collect();
    let (s, b) = api
        .post("/api/v1/agent/observations", &a.credential, upload(&batch))
        .await;
    assert_eq!(
        (s, &b["stored"], &b["refused"]),
        (StatusCode::OK, &json!(4096), &json!(0)),
        "{b}"
    );
    // One process more is refused and counted; the ones held still take their updates.
    let (_, b) = api
        .post(
            "/api/v1/agent/observations",
            &a.credential,
            upload(&[file(2000)]),
        )
        .await;
    assert_eq!(
        (&b["stored"], &b["refused"]),
        (&json!(0), &json!(64)),
        "{b}"
    );
    let mut again = file(1000);
    again.seq = 2;
    let (_, b) = api
        .post(
            "/api/v1/agent/observations",
            &a.credential,
            upload(&[again]),
        )
        .await;
    assert_eq!(
        (&b["stored"], &b["refused"]),
        (&json!(64), &json!(0)),
        "{b}"
    );
    let metrics = api
        .http
        .get(format!("{}/metrics", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("heddle_observed_refused_total{reason=\"too-many-rows\"} 64"),
        "{metrics}"
    );
    // Another user's job on the same node is not held to this job's rows.
    let (_, b) = api
        .post(
            "/api/v1/agent/observations",
            &a.credential,
            upload(&[rank_file("12", 2000, 3000, 0, 2, true, 1)]),
        )
        .await;
    assert_eq!(b["stored"], 1, "{b}");
}
