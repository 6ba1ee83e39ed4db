//! Job leases, results and their idempotency, lease expiry, and several replicas sharing
//! one database.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use heddle_server::testing::TestServer;
use heddle_types::jobs::Run;
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn job_life_cycle_and_idempotent_results() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let a = enroll(&api, &server, "life-1").await;
    let other = enroll(&api, &server, "life-2").await;
    let (run, job) = only_its_nodes_agent_claims_it(&server, &api, &a, &other).await;
    only_its_agent_renews_it_and_uploads_its_result(&server, &api, &a, &other, &run, &job).await;
    its_result_is_stored_once(&server, &api, &admin, &a, &run, &job).await;
    runs_are_listed_by_node_and_kind(&api, &admin).await;
}

/// Nothing to claim until a run is started; then only its node's agent claims it. Returns
/// the run and the job's id.
async fn only_its_nodes_agent_claims_it(
    server: &TestServer,
    api: &Api,
    a: &FakeAgent,
    other: &FakeAgent,
) -> (Run, String) {
    assert_eq!(a.try_claim(api).await.0, StatusCode::NO_CONTENT);
    let run = server.start_run(json!({"kind": "nccl", "params": {"op": "all_reduce"}, "env": {"NCCL_ALGO": "Ring"}, "nodes": ["life-1"], "label": "t"})).await;
    assert_eq!(run.state, "queued");
    // Another node's agent cannot take it.
    assert_eq!(other.try_claim(api).await.0, StatusCode::NO_CONTENT);
    let lease = a.claim(api).await;
    assert_eq!(lease["spec"]["env"]["NCCL_ALGO"], "Ring");
    assert_eq!(
        (
            lease["rank"].as_i64(),
            lease["world_size"].as_i64(),
            lease["attempt"].as_i64()
        ),
        (Some(0), Some(1), Some(1))
    );
    let job = lease["job_id"].as_str().unwrap().to_string();
    assert_eq!(server.get_run(run.id).await.state, "running");
    (run, job)
}

/// Its agent renews it with progress; another agent can neither renew it nor upload its
/// result.
async fn only_its_agent_renews_it_and_uploads_its_result(
    server: &TestServer,
    api: &Api,
    a: &FakeAgent,
    other: &FakeAgent,
    run: &Run,
    job: &str,
) {
    let (s, r) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/renew"),
            &a.credential,
            json!({"progress": {"fraction": 0.5, "message": "size 1 MiB"}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["cancel"], false);
    let run_now = server.get_run(run.id).await;
    assert_eq!(run_now.jobs[0].state.as_str(), "running");
    assert_eq!(
        run_now.jobs[0].progress.as_ref().unwrap().message,
        "size 1 MiB"
    );
    let (s, _) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/renew"),
            &other.credential,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "another agent cannot renew it");
    let (s, _) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &other.credential,
            result_body("k-other", "succeeded"),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "another node cannot upload its result"
    );
}

/// Uploaded twice with the same key: stored once; another result conflicts; the run has
/// succeeded and the job's lease is gone.
async fn its_result_is_stored_once(
    server: &TestServer,
    api: &Api,
    admin: &str,
    a: &FakeAgent,
    run: &Run,
    job: &str,
) {
    // Upload twice with the same key: stored once.
    let (s, first) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &a.credential,
            result_body("key-1", "succeeded"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let (s, second) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &a.credential,
            result_body("key-1", "succeeded"),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(second["created"], false);
    assert_eq!(first["result_id"], second["result_id"]);
    let (s, _) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &a.credential,
            result_body("key-2", "failed"),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "a different result for a finished job"
    );
    let (s, _) = api
        .post(
            "/api/v1/agent/jobs/00000000-0000-0000-0000-000000000001/result",
            &a.credential,
            result_body("key-3", "failed"),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM results")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM result_rows")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(rows, 2);

    let done = server.get_run(run.id).await;
    assert_eq!(done.state, "succeeded");
    assert!(done.finished_at.is_some());
    let (_, results) = api
        .get(&format!("/api/v1/runs/{}/results", run.id), admin)
        .await;
    assert_eq!(results[0]["rows"][1]["busbw_gbs"], 52.4);
    assert_eq!(results[0]["rows"][1]["labels"]["NCCL_ALGO"], "Ring");
    assert_eq!(results[0]["hostname"], "life-1");
    // Finished: renewing is refused.
    assert_eq!(
        api.post(
            &format!("/api/v1/agent/jobs/{job}/renew"),
            &a.credential,
            json!({})
        )
        .await
        .0,
        StatusCode::CONFLICT
    );
}

/// Listing filters by node and kind.
async fn runs_are_listed_by_node_and_kind(api: &Api, admin: &str) {
    let (_, runs) = api.get("/api/v1/runs?node=life-1&kind=nccl", admin).await;
    assert_eq!(runs.as_array().unwrap().len(), 1);
    let (_, runs) = api.get("/api/v1/runs?node=life-2", admin).await;
    assert_eq!(runs.as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn cancellation_reaches_queued_and_running_jobs() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let a = enroll(&api, &server, "cancel-1").await;
    let _b = enroll(&api, &server, "cancel-2").await;
    let run = server
        .start_run(
            json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["cancel-1", "cancel-2"]}),
        )
        .await;
    let (_, lease) = a.try_claim(&api).await;
    let job = lease["job_id"].as_str().unwrap().to_string();
    let (s, cancelled) = api
        .call(
            Method::POST,
            &format!("/api/v1/runs/{}/cancel", run.id),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        cancelled["jobs"][1]["state"], "cancelled",
        "the queued job ends at once"
    );
    assert_eq!(cancelled["jobs"][0]["state"], "leased");
    assert_eq!(cancelled["jobs"][0]["cancel_requested"], true);
    let (_, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"running_jobs": [job]}),
        )
        .await;
    assert_eq!(
        hb["cancel_jobs"][0],
        job.as_str(),
        "the heartbeat tells the agent"
    );
    let (_, r) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/renew"),
            &a.credential,
            json!({}),
        )
        .await;
    assert_eq!(r["cancel"], true);
    let (s, _) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &a.credential,
            result_body("c-1", "cancelled"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(server.get_run(run.id).await.state, "cancelled");
}

#[tokio::test]
async fn expired_leases_are_requeued_then_failed() {
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 1).await;
    let api = Api::new(&server);
    let a = enroll(&api, &server, "lease-1").await;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["lease-1"], "max_attempts": 2}))
        .await;

    // Attempt 1: claimed, then the agent goes silent.
    let lease = a.claim(&api).await;
    let job = lease["job_id"].as_str().unwrap().to_string();
    let claimed = std::time::Instant::now();
    loop {
        let r = server.get_run(run.id).await;
        if r.jobs[0].state.as_str() == "queued" {
            assert!(
                r.jobs[0].error.as_ref().unwrap().contains("attempt 1 of 2"),
                "{:?}",
                r.jobs[0].error
            );
            break;
        }
        // Lease 1.5 s, margin for unflushed heartbeats 0.25 s, reaper tick 0.25 s.
        assert!(
            claimed.elapsed() < Duration::from_millis(2500),
            "requeued within two heartbeat intervals (and the test's own delays)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A heartbeat naming the job now tells the agent to drop it.
    let (_, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"running_jobs": [job]}),
        )
        .await;
    assert_eq!(hb["cancel_jobs"][0], job.as_str());

    // Attempt 2, kept alive by heartbeats for a while, then silence: failed for good.
    let (_, lease) = a.try_claim(&api).await;
    assert_eq!(lease["attempt"], 2);
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, hb) = api
            .post(
                "/api/v1/agent/heartbeat",
                &a.credential,
                json!({"running_jobs": [job]}),
            )
            .await;
        assert_eq!(
            hb["cancel_jobs"].as_array().unwrap().len(),
            0,
            "heartbeats keep the lease"
        );
    }
    assert_eq!(
        server.get_run(run.id).await.jobs[0].state.as_str(),
        "leased"
    );
    let silent = std::time::Instant::now();
    loop {
        let r = server.get_run(run.id).await;
        if r.jobs[0].state.as_str() == "failed" {
            assert!(r.jobs[0].error.as_ref().unwrap().contains("attempt 2 of 2"));
            assert_eq!(r.state, "failed");
            break;
        }
        assert!(
            silent.elapsed() < Duration::from_millis(2500),
            "failed within two heartbeat intervals (and the test's own delays)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The late agent's result is still accepted once (nothing lost), and the job keeps it.
    let (s, _) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &a.credential,
            result_body("late", "succeeded"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
}

#[tokio::test]
async fn revoked_and_replaced_agents_are_locked_out() {
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 2).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let a = enroll(&api, &server, "rev-1").await;
    assert_eq!(
        api.post("/api/v1/agent/heartbeat", &a.credential, json!({}))
            .await
            .0,
        StatusCode::OK
    );
    // Re-enrolling the same host with a token bound to it replaces the old agent.
    let (_, t) = api
        .post(
            "/api/v1/enrollment-tokens",
            &admin,
            json!({"node": "rev-1"}),
        )
        .await;
    let (s, body) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(json!({"enroll_token": t["token"], "hostname": "rev-1"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let a2 = FakeAgent {
        credential: body["credential"].as_str().unwrap().to_string(),
        node_id: body["node_id"].as_str().unwrap().to_string(),
        agent_id: body["agent_id"].as_str().unwrap().to_string(),
    };
    assert_eq!(a2.node_id, a.node_id);
    let (s, b) = api
        .post("/api/v1/agent/heartbeat", &a.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b["message"].as_str().unwrap().contains("revoked"));
    let (s, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/agents/{}", a2.agent_id),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        api.post("/api/v1/agent/heartbeat", &a2.credential, json!({}))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(a2.try_claim(&api).await.0, StatusCode::UNAUTHORIZED);
    // Enrollment tokens run out and can be revoked.
    let (_, t) = api
        .post("/api/v1/enrollment-tokens", &admin, json!({"max_uses": 1}))
        .await;
    let token = t["token"].as_str().unwrap();
    let body = |h: &str| Some(json!({"enroll_token": token, "hostname": h}));
    assert_eq!(
        api.call(Method::POST, "/api/v1/agent/enroll", None, body("once-1"))
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        api.call(Method::POST, "/api/v1/agent/enroll", None, body("once-2"))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    let (_, t) = api
        .post("/api/v1/enrollment-tokens", &admin, json!({}))
        .await;
    let (id, token) = (t["id"].as_str().unwrap(), t["token"].as_str().unwrap());
    api.call(
        Method::DELETE,
        &format!("/api/v1/enrollment-tokens/{id}"),
        Some(&admin),
        None,
    )
    .await;
    let (s, _) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(json!({"enroll_token": token, "hostname": "late"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(json!({"enroll_token": "x", "hostname": "bad host/name"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

/// 200 jobs, 5 agents with 4 concurrent workers each, every worker alternating between two
/// replicas on one database: every job is claimed and stored exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_never_double_claim() {
    let first = TestServer::start().await;
    let second = TestServer::start_on(&first.database_url(), |_| {}).await;
    let api = Api::new(&first);
    let mut agents = Vec::new();
    for i in 0..5 {
        agents.push(enroll(&api, &first, &format!("rep-{i}")).await);
    }
    let mut run_ids = Vec::new();
    for i in 0..40 {
        // Each run spans all five nodes: 40 × 5 = 200 jobs.
        let nodes: Vec<String> = (0..5).map(|n| format!("rep-{n}")).collect();
        let run = first
            .start_run(json!({"kind": "memcpy", "nodes": nodes, "label": format!("r{i}")}))
            .await;
        run_ids.push(run.id);
    }
    let claims: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let bases = [first.url.clone(), second.url.clone()];
    let mut tasks = Vec::new();
    for agent in &agents {
        for worker in 0..4 {
            let claims = claims.clone();
            let cred = agent.credential.clone();
            let bases = bases.clone();
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut turn = worker;
                loop {
                    let base = &bases[turn % 2];
                    turn += 1;
                    let resp = http
                        .post(format!("{base}/api/v1/agent/jobs/claim"))
                        .bearer_auth(&cred)
                        .send()
                        .await
                        .unwrap();
                    if resp.status() == StatusCode::NO_CONTENT {
                        break;
                    }
                    assert_eq!(resp.status(), StatusCode::OK);
                    let lease: serde_json::Value = resp.json().await.unwrap();
                    let job = lease["job_id"].as_str().unwrap().to_string();
                    *claims.lock().unwrap().entry(job.clone()).or_default() += 1;
                    // Upload through the other replica, and retry once as a lost ack would.
                    let other = &bases[turn % 2];
                    for _ in 0..2 {
                        let r = http
                            .post(format!("{other}/api/v1/agent/jobs/{job}/result"))
                            .bearer_auth(&cred)
                            .json(&result_body(&format!("up-{job}"), "succeeded"))
                            .send()
                            .await
                            .unwrap();
                        assert!(
                            r.status() == StatusCode::CREATED || r.status() == StatusCode::OK,
                            "{}",
                            r.status()
                        );
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let claims = claims.lock().unwrap().clone();
    assert_eq!(claims.len(), 200, "every job was claimed");
    assert!(
        claims.values().all(|&n| n == 1),
        "no job was claimed twice: {claims:?}"
    );
    let (results,): (i64,) = sqlx::query_as("SELECT count(*) FROM results")
        .fetch_one(&first.state.db)
        .await
        .unwrap();
    assert_eq!(results, 200, "every result stored exactly once");
    let (ok,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM jobs WHERE state = 'succeeded' AND attempts = 1")
            .fetch_one(&first.state.db)
            .await
            .unwrap();
    assert_eq!(ok, 200);
    for id in run_ids {
        assert_eq!(second.get_run(id).await.state, "succeeded");
    }
    second.stop().await;
}
