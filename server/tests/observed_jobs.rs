//! Observed workloads through the API: uploads are idempotent by seq, hostile bodies are
//! refused before anything is stored, another user naming the same job is another workload,
//! lists page, a node keeps its most recently seen workloads, and sockets on an IB node fail
//! the workload. The deprecated `/api/v1/jobs` paths: `workload_aliases.rs`.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use heddle_server::testing::TestServer;
use heddle_server::testing::spool::upload;
use heddle_types::observe::{
    CommObservation, JobIdentity, NetUse, OpBand, SPOOL_FORMAT, SpoolFile,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

mod common;
use common::*;

fn file(slurm: &str, uid: u32, seq: u64, net: &str) -> SpoolFile {
    SpoolFile {
        format: SPOOL_FORMAT,
        job: JobIdentity {
            pid: 100,
            uid,
            start_ticks: 5,
            slurm_job_id: Some(slurm.into()),
            slurm_step_id: None,
            k8s_namespace: None,
            k8s_pod: None,
            torchrun_run_id: None,
            comm: Some("train".into()),
        },
        seq,
        is_final: false,
        written_at: chrono::Utc::now(),
        plugin_version: "0.1.0".into(),
        nccl_version: None,
        env_applied: Some("abc".into()),
        comms: vec![CommObservation {
            comm_hash: "c0ffee".into(),
            name: None,
            nranks: 16,
            nnodes: 2,
            rank: 0,
            ops: vec![OpBand {
                func: "AllReduce".into(),
                size_band: 30,
                ops: 1,
                bytes: 1 << 30,
                time_ns: 10_000_000,
                algos: Default::default(),
                protos: Default::default(),
                max_channels: 0,
                exec_ops: 0,
                exec_bytes: 0,
                exec_ns: 0,
            }],
            net: vec![NetUse {
                net: net.into(),
                ops: 10,
                bytes: 1 << 30,
                inferred: false,
            }],
            proxy_ops: 0,
            dropped_events: 0,
            finalized_at: None,
            progress: None,
        }],
        dropped_events: 0,
        dropped_comms: 0,
    }
}

#[tokio::test]
async fn uploads_are_idempotent_checked_paged_and_judged() {
    let server = TestServer::start_with(|c| c.observed_jobs_keep = 3).await;
    let api = Api::new(&server);
    let agent = enroll(&api, &server, "obs-1").await;
    let cred = agent.credential.as_str();
    let facts = json!({"host": {"hostname": "obs-1"}, "rdma": {"devices": [
        {"name": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "link_layer": "InfiniBand"}]}]}});
    let (s, b) = api
        .call(Method::PUT, "/api/v1/agent/facts", Some(cred), Some(facts))
        .await;
    assert!(s.is_success(), "{b}");
    let post = |body: Value| api.post("/api/v1/agent/observations", cred, body);

    // Stored once; the same seq again, or an older one, changes nothing.
    let (s, b) = post(upload(&[file("1", 1000, 5, "Socket")])).await;
    assert_eq!(
        (s, &b["stored"], &b["unchanged"]),
        (StatusCode::OK, &json!(1), &json!(0)),
        "{b}"
    );
    let (_, b) = post(upload(&[file("1", 1000, 5, "IB")])).await;
    assert_eq!((&b["stored"], &b["unchanged"]), (&json!(0), &json!(1)));
    let (_, b) = post(upload(&[file("1", 1000, 4, "IB")])).await;
    assert_eq!(b["stored"], 0);
    let (_, jobs) = api.get("/api/v1/workloads", &server.admin_token).await;
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{jobs}");
    let job = &jobs[0];
    assert_eq!(job["verdict"], "fail", "{job}");
    assert_eq!(job["reasons"][0]["code"], "job-socket-fallback");
    let id = job["id"].as_str().unwrap().to_string();
    let (_, detail) = api
        .get(&format!("/api/v1/workloads/{id}"), &server.admin_token)
        .await;
    assert_eq!(detail["comms"][0]["transport"], "Socket", "{detail}");
    // A later seq over IB replaces it: the job passes.
    let (_, b) = post(upload(&[file("1", 1000, 6, "IB")])).await;
    assert_eq!(b["stored"], 1);
    let (_, detail) = api
        .get(&format!("/api/v1/workloads/{id}"), &server.admin_token)
        .await;
    assert_eq!(detail["verdict"], "pass", "{detail}");

    // Hostile bodies: refused, nothing stored.
    let mut dup = file("2", 1000, 1, "IB");
    dup.comms.push(dup.comms[0].clone());
    let mut control = file("2", 1000, 1, "IB");
    control.comms[0].comm_hash = "a\u{7}b".into();
    let huge_seq = file("2", 1000, u64::MAX, "IB");
    let many: Vec<SpoolFile> = (0..65)
        .map(|i| file(&format!("m{i}"), 1000, 1, "IB"))
        .collect();
    for (what, body) in [
        ("a communicator twice", upload(&[dup])),
        ("a control character", upload(&[control])),
        ("a seq Postgres cannot hold", upload(&[huge_seq])),
        ("65 observations", upload(&many)),
    ] {
        let (s, b) = post(body).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {b}");
    }
    let (s, _) = post(json!({"observations": [], "extra": 1})).await;
    assert!(s.is_client_error());
    let (s, _) = api
        .post(
            "/api/v1/agent/observations",
            &server.admin_token,
            upload(&[file("3", 1, 1, "IB")]),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "an API token is not an agent");
    let (_, jobs) = api.get("/api/v1/workloads", &server.admin_token).await;
    assert_eq!(jobs.as_array().unwrap().len(), 1, "nothing stored: {jobs}");

    // Another user naming the same Slurm job is another job.
    post(upload(&[file("1", 2000, 1, "IB")])).await;
    // Two more jobs: the node keeps its three most recently seen.
    post(upload(&[file("7", 1000, 1, "IB")])).await;
    post(upload(&[file("8", 1000, 1, "IB")])).await;
    let (_, jobs) = api
        .get("/api/v1/workloads?node=obs-1", &server.admin_token)
        .await;
    let keys: Vec<(&str, u64)> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["job_key"].as_str().unwrap(), j["uid"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        keys,
        vec![("slurm:8", 1000), ("slurm:7", 1000), ("slurm:1", 2000)]
    );

    // Pages of two: the cursor resumes after the last row.
    let http = reqwest::Client::new();
    let first = http
        .get(format!("{}/api/v1/workloads?limit=2", server.url))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap();
    let cursor = first.headers()["x-next-cursor"]
        .to_str()
        .unwrap()
        .to_string();
    let rows: Vec<Value> = first.json().await.unwrap();
    assert_eq!(rows.len(), 2);
    let (_, rest) = api
        .get(
            &format!("/api/v1/workloads?limit=2&cursor={cursor}"),
            &server.admin_token,
        )
        .await;
    assert_eq!(rest[0]["job_key"], "slurm:1", "{rest}");
    // One Slurm job, alone, on its node, and paged: each filter is its own statement.
    for (query, want) in [
        ("slurm_job=7", vec!["slurm:7"]),
        ("slurm_job=7&node=obs-1", vec!["slurm:7"]),
        ("slurm_job=1&node=obs-1", vec!["slurm:1"]),
        ("slurm_job=404", vec![]),
        ("node=obs-1&limit=1", vec!["slurm:8"]),
    ] {
        let (s, rows) = api
            .get(&format!("/api/v1/workloads?{query}"), &server.admin_token)
            .await;
        assert_eq!(s, StatusCode::OK, "{query}: {rows}");
        let keys: Vec<&str> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job_key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, want, "{query}");
    }
    let page = http
        .get(format!(
            "{}/api/v1/workloads?node=obs-1&limit=1",
            server.url
        ))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap();
    let cursor = page.headers()["x-next-cursor"]
        .to_str()
        .unwrap()
        .to_string();
    let (_, next) = api
        .get(
            &format!("/api/v1/workloads?node=obs-1&limit=1&cursor={cursor}"),
            &server.admin_token,
        )
        .await;
    assert_eq!(next[0]["job_key"], "slurm:7", "{next}");
    let (s, _) = api
        .get("/api/v1/workloads?cursor=bogus", &server.admin_token)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = api
        .get(
            &format!("/api/v1/workloads/{}", uuid::Uuid::nil()),
            &server.admin_token,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}
