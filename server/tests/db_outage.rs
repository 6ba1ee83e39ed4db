//! A Postgres outage is a non-event: while the database is down every request that needs it
//! answers 503 with `Retry-After` (never 500) and `/readyz` says since when and why; when it
//! returns, no lease has expired because of the outage, and the reaper judges leases again.
//!
//! The outage test stops a real Postgres: a private cluster of its own (initdb in a fresh
//! temporary directory, on a free port), never the shared one of HEDDLE_TEST_DATABASE_URL.

mod common;

use std::time::{Duration, Instant};

use common::*;
use heddle_server::testing::private_pg::PrivatePostgres;
use heddle_server::testing::{TestDb, TestServer};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn renew(api: &Api, agent: &FakeAgent, lease: &Value) -> (StatusCode, Value) {
    let job = lease["job_id"].as_str().unwrap();
    api.post(
        &format!("/api/v1/agent/jobs/{job}/renew"),
        &agent.credential,
        json!({"claim_id": lease["claim_id"]}),
    )
    .await
}

/// One request while the database is down: 503, `Retry-After`, the `unavailable` code.
async fn expect_503(api: &Api, method: Method, path: &str, token: &str, body: Option<Value>) {
    let mut req = api
        .http
        .request(method.clone(), format!("{}{path}", api.base))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req
        .send()
        .await
        .expect("the server answers while Postgres is down");
    let status = resp.status();
    let retry = resp.headers().get("retry-after").cloned();
    let text = resp.text().await.unwrap();
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{method} {path}: {text}"
    );
    assert!(retry.is_some(), "{method} {path}: no Retry-After");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"], "unavailable", "{method} {path}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outage_answers_503_and_expires_no_lease() {
    let pg = PrivatePostgres::start();
    // A 2 s heartbeat: 3 s leases, reaper ticks every 0.5 s.
    let server = TestServer::start_on(&pg.url(), |c| c.heartbeat_interval_s = 2).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let agent = enroll(&api, &server, "outage-1").await;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 3600}, "nodes": ["outage-1"]}))
        .await;
    let lease = agent.claim(&api).await;
    assert_eq!(renew(&api, &agent, &lease).await.0, StatusCode::OK);
    let run_path = format!("/api/v1/runs/{}", run.id);

    pg.stop();
    let down_at = Instant::now();
    // Every kind of request gets 503, never 500: right after the stop (pooled connections
    // get 57P01 admin_shutdown or a closed socket), and again after the lease ran out
    // twice over (new connections are refused; the pool times out).
    let job = lease["job_id"].as_str().unwrap().to_string();
    let renew_path = format!("/api/v1/agent/jobs/{job}/renew");
    for round_until in [Duration::ZERO, Duration::from_secs(7)] {
        tokio::time::sleep(round_until.saturating_sub(down_at.elapsed())).await;
        tokio::join!(
            expect_503(&api, Method::GET, &run_path, &admin, None),
            expect_503(&api, Method::GET, "/api/v1/nodes", &admin, None),
            expect_503(
                &api,
                Method::POST,
                "/api/v1/agent/heartbeat",
                &agent.credential,
                Some(json!({"running_jobs": [job]})),
            ),
            expect_503(
                &api,
                Method::POST,
                &renew_path,
                &agent.credential,
                Some(json!({"claim_id": lease["claim_id"]})),
            ),
            async {
                let ready = api
                    .http
                    .get(format!("{}/readyz", api.base))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert!(ready.headers().contains_key("retry-after"));
                let why = ready.text().await.unwrap();
                assert!(
                    why.starts_with("database unreachable since ") && why.contains("last error: "),
                    "{why}"
                );
            },
        );
    }
    // Past the revocation delay the agent's credential is no longer trusted from memory:
    // while the outage is known, its request is still refused at once, not after the
    // pool's 5 s acquire timeout (an agent heard 5 s late after the database is back).
    let asked = Instant::now();
    expect_503(
        &api,
        Method::POST,
        "/api/v1/agent/heartbeat",
        &agent.credential,
        Some(json!({"running_jobs": []})),
    )
    .await;
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "a heartbeat in a known outage took {:?}",
        asked.elapsed()
    );
    // The reason names the refused connection, not only a pool timeout.
    let why = api
        .http
        .get(format!("{}/readyz", api.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(why.to_lowercase().contains("refused"), "{why}");

    pg.resume();
    let back = Instant::now();
    loop {
        let r = api.http.get(format!("{}/readyz", api.base)).send().await;
        if r.is_ok_and(|r| r.status() == StatusCode::OK) {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(30), "not ready again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the reaper tick a few times before the agent is heard from again: a lease judged
    // on wall-clock time would be requeued now (it ran out seconds ago).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (s, renewed) = renew(&api, &agent, &lease).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "the lease survived the outage: {renewed}"
    );
    let (s, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &agent.credential,
            json!({"running_jobs": [lease["job_id"]]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{hb}");
    assert_eq!(hb["cancel_jobs"], json!([]), "no child is stopped: {hb}");
    let (_, job) = api.get(&run_path, &admin).await;
    assert_eq!(job["jobs"][0]["state"], "running", "{job}");
    assert_eq!(job["jobs"][0]["attempts"], 1, "not requeued: {job}");

    // Leases are judged again: an agent that now goes quiet loses its job within a lease
    // term and a few ticks.
    let quiet = Instant::now();
    loop {
        let (_, run) = api.get(&run_path, &admin).await;
        if run["jobs"][0]["state"] == "queued" {
            break;
        }
        assert!(
            quiet.elapsed() < Duration::from_secs(15),
            "the lease never expired after the outage: {run}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await;
}

/// The lease clock, tick by tick, on the shared test cluster (no outage needed): a gap in
/// the clock gives old leases a fresh term; without a gap an expired lease is reaped.
#[tokio::test]
async fn a_gap_in_the_lease_clock_gives_old_leases_a_fresh_term() {
    let db = TestDb::create().await;
    let server = TestServer::start_on(&db.url, |c| c.heartbeat_interval_s = 2).await;
    let api = Api::new(&server);
    let agent = enroll(&api, &server, "clock-1").await;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["clock-1"]}))
        .await;
    let lease = agent.claim(&api).await;
    let job: uuid::Uuid = lease["job_id"].as_str().unwrap().parse().unwrap();
    // No reaper of its own from here on: the test ticks by hand.
    server.stop().await;
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let hb = Duration::from_secs(2);
    let ttl = Duration::from_secs(3);

    // The clock last ticked a minute ago, just after the lease was renewed; the lease ran
    // out 58 s ago, during that gap.
    sqlx::query("UPDATE lease_clock SET ticked_at = now() - interval '60 seconds'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '58 seconds' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    let (clock, reaped) = heddle_server::leases::tick(&pool, hb, ttl, Duration::ZERO)
        .await
        .unwrap();
    assert!(clock.gap >= Duration::from_secs(59), "{clock:?}");
    assert_eq!((clock.extended, reaped), (1, 0));
    let (state, left): (String, f64) = sqlx::query_as(
        "SELECT state, extract(epoch FROM lease_expires_at - now())::float8 FROM jobs WHERE id = $1",
    )
    .bind(job)
    .fetch_one(&pool)
    .await
    .unwrap();
    // A fresh term: one lease plus the allowance (two ticks of half a second).
    assert_eq!(state, "leased");
    assert!((3.5..=4.5).contains(&left), "{left} s left");

    // The next tick finds no gap and extends nothing; a lease that runs out now is reaped.
    sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    let (clock, reaped) = heddle_server::leases::tick(&pool, hb, ttl, Duration::ZERO)
        .await
        .unwrap();
    assert!(clock.gap < Duration::from_secs(1), "{clock:?}");
    assert_eq!((clock.extended, reaped), (0, 1));
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("queued", 1));
    let _ = run;
    pool.close().await;
}
