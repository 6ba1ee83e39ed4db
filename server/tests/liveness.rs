//! Heartbeats written in batches: many heartbeats become one flush, leases are judged with
//! a margin for heartbeats still in memory, a replica that stops flushes on its way out,
//! and API tokens' `last_used_at` is written at most once a minute.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::json;
use uuid::Uuid;

/// A replica that never flushes on its own during a test (the flush interval is capped at
/// a quarter of an hour-long heartbeat), so a test decides when heartbeats are written.
fn no_periodic_flush(c: &mut heddle_server::Config) {
    c.heartbeat_interval_s = 3600;
    c.heartbeat_flush_ms = 3_600_000;
}

async fn heartbeats_of(db: &sqlx::PgPool) -> Vec<(Uuid, Option<DateTime<Utc>>, String)> {
    sqlx::query_as("SELECT id, last_heartbeat_at, xmin::text FROM agents ORDER BY id")
        .fetch_all(db)
        .await
        .unwrap()
}

async fn claim(api: &Api, agent: &FakeAgent) -> String {
    agent.claim(api).await["job_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn lease_of(db: &sqlx::PgPool, job: &str) -> (String, Option<DateTime<Utc>>) {
    sqlx::query_as("SELECT state, lease_expires_at FROM jobs WHERE id = $1::uuid")
        .bind(job)
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn many_heartbeats_are_written_by_one_flush() {
    let server = TestServer::start_with(no_periodic_flush).await;
    let api = Api::new(&server);
    let db = server.state.db.clone();
    let mut agents = Vec::new();
    for i in 0..12 {
        agents.push(enroll(&api, &server, &format!("batch-{i}")).await);
    }
    server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["batch-0"]}))
        .await;
    let job = claim(&api, &agents[0]).await;
    let (_, leased_until) = lease_of(&db, &job).await;
    let before = heartbeats_of(&db).await;

    for round in 0..3 {
        for a in &agents {
            let running = if a.node_id == agents[0].node_id {
                json!([job])
            } else {
                json!([])
            };
            let (s, hb) = api
                .post(
                    "/api/v1/agent/heartbeat",
                    &a.credential,
                    json!({"agent_version": format!("9.{round}"), "running_jobs": running}),
                )
                .await;
            assert_eq!(s, StatusCode::OK, "{hb}");
            assert_eq!(
                hb["cancel_jobs"],
                json!([]),
                "the job is still this agent's"
            );
        }
    }
    // 36 heartbeats, and not one row written yet.
    assert_eq!(heartbeats_of(&db).await, before);
    assert_eq!(lease_of(&db, &job).await.1, leased_until);
    assert_eq!(server.state.liveness.pending(), agents.len());

    let flushed = server
        .state
        .liveness
        .flush(&db, server.state.config.lease_ttl())
        .await
        .unwrap();
    assert_eq!((flushed.agents, flushed.leases), (12, 1));
    assert_eq!(server.state.liveness.pending(), 0);
    let after = heartbeats_of(&db).await;
    for (old, new) in before.iter().zip(&after) {
        assert!(
            new.1 > old.1,
            "every agent's heartbeat moved: {old:?} → {new:?}"
        );
    }
    // One transaction wrote every agent row.
    let writers: std::collections::BTreeSet<&String> = after.iter().map(|r| &r.2).collect();
    assert_eq!(writers.len(), 1, "{after:?}");
    let versions: Vec<(String,)> = sqlx::query_as("SELECT DISTINCT version FROM agents")
        .fetch_all(&db)
        .await
        .unwrap();
    assert_eq!(
        versions,
        vec![("9.2".to_string(),)],
        "the latest heartbeat wins"
    );
    let seen: (i64,) = sqlx::query_as(
        "SELECT count(*) FROM nodes n JOIN agents a ON a.node_id = n.id
         WHERE n.last_seen_at = a.last_heartbeat_at",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(seen.0, 12, "nodes' last_seen_at is their agents' heartbeat");
    let (state, renewed) = lease_of(&db, &job).await;
    assert_eq!(state, "leased");
    assert!(renewed > leased_until, "the flush renewed the lease");

    // Nothing pending: a flush writes nothing.
    let flushed = server
        .state
        .liveness
        .flush(&db, server.state.config.lease_ttl())
        .await
        .unwrap();
    assert_eq!(flushed.agents, 0);
    assert_eq!(heartbeats_of(&db).await, after);
}

#[tokio::test]
async fn a_lease_within_the_margin_is_kept_and_heartbeats_renew_it() {
    let server = TestServer::start_with(no_periodic_flush).await;
    let api = Api::new(&server);
    let db = server.state.db.clone();
    let a = enroll(&api, &server, "margin-1").await;
    server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["margin-1"]}))
        .await;
    let job = claim(&api, &a).await;
    // The recorded lease ran out 2 s ago; the agent's heartbeat naming it waits in memory.
    sqlx::query(
        "UPDATE jobs SET lease_expires_at = now() - interval '2 seconds' WHERE id = $1::uuid",
    )
    .bind(&job)
    .execute(&db)
    .await
    .unwrap();
    let (s, hb) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"running_jobs": [job]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(hb["cancel_jobs"], json!([]));
    // A margin of one flush interval (here 3 s) keeps the job.
    let reaped = heddle_server::leases::reap_expired(
        &mut db.acquire().await.unwrap(),
        Duration::from_secs(3),
    )
    .await
    .unwrap();
    assert_eq!(reaped, 0);
    assert_eq!(lease_of(&db, &job).await.0, "leased");
    // The flush renews it from the heartbeat's time.
    server
        .state
        .liveness
        .flush(&db, server.state.config.lease_ttl())
        .await
        .unwrap();
    let (_, until) = lease_of(&db, &job).await;
    assert!(until.unwrap() > Utc::now() + chrono::Duration::minutes(60));
    // Past the margin and not renewed, a lease is reaped.
    sqlx::query(
        "UPDATE jobs SET lease_expires_at = now() - interval '4 seconds' WHERE id = $1::uuid",
    )
    .bind(&job)
    .execute(&db)
    .await
    .unwrap();
    let reaped = heddle_server::leases::reap_expired(
        &mut db.acquire().await.unwrap(),
        Duration::from_secs(3),
    )
    .await
    .unwrap();
    assert_eq!(reaped, 1);
    assert_eq!(lease_of(&db, &job).await.0, "queued");
    // A late flush of a heartbeat for a requeued job renews nothing.
    api.post(
        "/api/v1/agent/heartbeat",
        &a.credential,
        json!({"running_jobs": [job]}),
    )
    .await;
    let flushed = server
        .state
        .liveness
        .flush(&db, server.state.config.lease_ttl())
        .await
        .unwrap();
    assert_eq!((flushed.agents, flushed.leases), (1, 0));
    assert_eq!(lease_of(&db, &job).await, ("queued".to_string(), None));
}

#[tokio::test]
async fn heartbeats_keep_a_lease_for_its_whole_run_and_silence_ends_it() {
    // A 1 s heartbeat: flushes every 250 ms, leases of 1.5 s, a margin of 250 ms.
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 1).await;
    assert_eq!(
        server.state.config.heartbeat_flush_interval(),
        Duration::from_millis(250)
    );
    let api = Api::new(&server);
    let a = enroll(&api, &server, "steady-1").await;
    server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["steady-1"]}))
        .await;
    let job = claim(&api, &a).await;
    // Four lease lengths of heartbeats, each a full interval after the last.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (_, hb) = api
            .post(
                "/api/v1/agent/heartbeat",
                &a.credential,
                json!({"running_jobs": [job]}),
            )
            .await;
        assert_eq!(hb["cancel_jobs"], json!([]), "heartbeats keep the lease");
    }
    let silent = std::time::Instant::now();
    loop {
        let (state, _) = lease_of(&server.state.db, &job).await;
        if state == "queued" {
            break;
        }
        assert_eq!(state, "leased");
        // Lease (1.5 s) + margin (0.25 s) + reaper tick (0.25 s), and the test's own delays.
        assert!(
            silent.elapsed() < Duration::from_millis(2600),
            "never requeued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_replica_that_stops_flushes_what_it_heard() {
    // `first` owns the database; `second` hears the heartbeat and stops.
    let first = TestServer::start_with(no_periodic_flush).await;
    let second = TestServer::start_on(&first.database_url(), no_periodic_flush).await;
    let api = Api::new(&second);
    let a = enroll(&api, &second, "failover-1").await;
    second
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["failover-1"]}))
        .await;
    let job = claim(&api, &a).await;
    let db = first.state.db.clone();
    let (_, claimed_until) = lease_of(&db, &job).await;
    let enrolled = heartbeats_of(&db).await;
    let (s, _) = api
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"agent_version": "last-words", "running_jobs": [job]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(heartbeats_of(&db).await, enrolled, "not written yet");
    second.stop().await;
    let stopped = heartbeats_of(&db).await;
    assert!(
        stopped[0].1 > enrolled[0].1,
        "the last flush wrote the heartbeat"
    );
    let (state, until) = lease_of(&db, &job).await;
    assert_eq!(state, "leased");
    assert!(until > claimed_until, "and renewed the lease");
    let version: (String,) = sqlx::query_as("SELECT version FROM agents")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(version.0, "last-words");
    // The agent carries on with the other replica, which keeps the job its agent's.
    let (s, hb) = Api::new(&first)
        .post(
            "/api/v1/agent/heartbeat",
            &a.credential,
            json!({"running_jobs": [job]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(hb["cancel_jobs"], json!([]));
    assert_eq!(first.state.liveness.pending(), 1);
}

#[tokio::test]
async fn a_token_records_its_use_at_most_once_a_minute() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.token(heddle_types::auth::Role::Viewer).await;
    let used = || async {
        let row: (Option<DateTime<Utc>>, String) = sqlx::query_as(
            "SELECT last_used_at, xmin::text FROM api_tokens WHERE name LIKE 'viewer-%'",
        )
        .fetch_one(&server.state.db)
        .await
        .unwrap();
        row
    };
    assert_eq!(used().await.0, None);
    assert_eq!(api.get("/api/v1/nodes", &token).await.0, StatusCode::OK);
    let first = used().await;
    assert!(first.0.is_some(), "the first use is recorded");
    for _ in 0..5 {
        assert_eq!(api.get("/api/v1/nodes", &token).await.0, StatusCode::OK);
    }
    assert_eq!(used().await, first, "the row was not written again");
    // A minute later the next request records its use again.
    sqlx::query(
        "UPDATE api_tokens SET last_used_at = now() - interval '61 seconds' WHERE name LIKE 'viewer-%'",
    )
    .execute(&server.state.db)
    .await
    .unwrap();
    assert_eq!(api.get("/api/v1/nodes", &token).await.0, StatusCode::OK);
    let again = used().await.0.unwrap();
    assert!(again > first.0.unwrap());
}

async fn beat(api: &Api, agent: &FakeAgent) -> StatusCode {
    api.post("/api/v1/agent/heartbeat", &agent.credential, json!({}))
        .await
        .0
}

#[tokio::test]
async fn a_credential_revoked_on_one_replica_stops_working_on_every_replica_within_the_delay() {
    let delay = |c: &mut heddle_server::Config| c.revocation_delay_ms = 400;
    let first = TestServer::start_with(delay).await;
    let second = TestServer::start_on(&first.database_url(), delay).await;
    let (one, two) = (Api::new(&first), Api::new(&second));
    let revoked = enroll(&one, &first, "revoked-1").await;
    let deleted = enroll(&one, &first, "deleted-1").await;
    let kept = enroll(&one, &first, "kept-1").await;
    // `second` checks each credential in Postgres once, then answers from memory.
    let started = std::time::Instant::now();
    while second.state.credentials.len() < 3 {
        for a in [&revoked, &deleted, &kept] {
            assert_eq!(beat(&two, a).await, StatusCode::OK);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never cached");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admin = first.admin_token.clone();
    let (s, _) = one
        .call(
            Method::DELETE,
            &format!("/api/v1/agents/{}", revoked.agent_id),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, b) = one
        .call(
            Method::DELETE,
            "/api/v1/nodes/deleted-1",
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let done = std::time::Instant::now();
    // The replica that revoked refuses at once.
    assert_eq!(beat(&one, &revoked).await, StatusCode::UNAUTHORIZED);
    assert_eq!(beat(&one, &deleted).await, StatusCode::UNAUTHORIZED);
    // The other within the delay (and its poll): here well under a few of them.
    loop {
        let (r, d) = (beat(&two, &revoked).await, beat(&two, &deleted).await);
        if r == StatusCode::UNAUTHORIZED && d == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(
            done.elapsed() < Duration::from_secs(5),
            "still accepted {:?} after the revocation: {r} {d}",
            done.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("refused by the other replica after {:?}", done.elapsed());
    assert_eq!(beat(&two, &kept).await, StatusCode::OK);
    assert_eq!(second.state.credentials.len(), 1);
}
