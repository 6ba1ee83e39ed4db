//! Attacks on node identity, tokens and job claims, each performed against a real server
//! (and Postgres). Limits at the door are in `hostile_limits.rs`; the same attacks with
//! real agent processes are in `agent/tests/hostile_identity.rs`.

mod common;

use std::time::Duration;

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn claim(api: &Api, credential: &str) -> (StatusCode, Value) {
    api.call(
        Method::POST,
        "/api/v1/agent/jobs/claim",
        Some(credential),
        None,
    )
    .await
}

#[tokio::test]
async fn second_agent_enrolling_live_hostname_does_not_take_its_jobs() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let live = enroll(&api, &server, "victim").await;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["victim"]}))
        .await;

    // The intruder holds a valid enrollment token and claims the live node's host name.
    let token = server.enrollment_token().await;
    let (s, pending) = enroll_with(&api, &token, "victim").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{pending}");
    assert!(pending.get("credential").is_none(), "{pending}");
    let message = pending["message"].as_str().unwrap();
    let pending_id = pending["pending_id"].as_str().unwrap();
    assert!(
        message.contains(&format!("heddle agents approve {pending_id}")),
        "{message}"
    );
    let ticket = pending["ticket"].as_str().unwrap().to_string();

    // The live agent is untouched and gets its node's job.
    let (s, _) = api
        .post("/api/v1/agent/heartbeat", &live.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "the live agent keeps its credential");
    let (s, lease) = claim(&api, &live.credential).await;
    assert_eq!(s, StatusCode::OK, "{lease}");
    assert_eq!(lease["run_id"], run.id.to_string());

    // Asking again with the ticket keeps waiting; a forged ticket gets nothing.
    let again = |ticket: String| json!({"enroll_token": token, "hostname": "victim", "pending_ticket": ticket});
    let (s, b) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(again(ticket.clone())),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{b}");
    let (s, _) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(again("hdp_forged".into())),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // The admin sees it, with the live agent it would replace, and rejects it.
    let (s, list) = api.get("/api/v1/agents/pending", &admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list[0]["hostname"], "victim");
    assert_eq!(list[0]["live_agent_id"], live.agent_id.as_str());
    let (s, _) = api
        .post(
            &format!("/api/v1/agents/pending/{pending_id}/reject"),
            &admin,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, b) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(again(ticket)),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
    assert!(b["message"].as_str().unwrap().contains("rejected"), "{b}");
    let (s, _) = api
        .post("/api/v1/agent/heartbeat", &live.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (agents,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM agents a JOIN nodes n ON n.id = a.node_id WHERE n.hostname = 'victim'")
            .fetch_one(&server.state.db)
            .await
            .unwrap();
    assert_eq!(agents, 1, "no second credential was ever issued");
}

#[tokio::test]
async fn approved_enrollment_replaces_the_live_agent_only_then() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let old = enroll(&api, &server, "rebuilt").await;
    let token = server.enrollment_token().await;
    let (s, pending) = enroll_with(&api, &token, "rebuilt").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let id = pending["pending_id"].as_str().unwrap();
    let ask =
        json!({"enroll_token": token, "hostname": "rebuilt", "pending_ticket": pending["ticket"]});
    // Only an admin decides.
    let operator = server.token(heddle_types::auth::Role::Operator).await;
    let (s, _) = api
        .post(
            &format!("/api/v1/agents/pending/{id}/approve"),
            &operator,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, b) = api
        .post(
            &format!("/api/v1/agents/pending/{id}/approve"),
            &admin,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["state"], "approved");
    // Approval alone revokes nothing; collecting the credential does.
    let (s, _) = api
        .post("/api/v1/agent/heartbeat", &old.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, enrolled) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(ask.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{enrolled}");
    assert_eq!(enrolled["node_id"], old.node_id.as_str());
    let (s, _) = api
        .post("/api/v1/agent/heartbeat", &old.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let fresh = enrolled["credential"].as_str().unwrap();
    let (s, _) = api.post("/api/v1/agent/heartbeat", fresh, json!({})).await;
    assert_eq!(s, StatusCode::OK);
    // The ticket is spent: it cannot mint a second credential.
    let (s, _) = api
        .call(Method::POST, "/api/v1/agent/enroll", None, Some(ask))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Deciding twice is a conflict.
    let (s, _) = api
        .post(
            &format!("/api/v1/agents/pending/{id}/reject"),
            &admin,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
}

#[tokio::test]
async fn token_bound_to_a_node_enrolls_only_that_node() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let old = enroll(&api, &server, "bound-1").await;
    let (s, t) = api
        .post(
            "/api/v1/enrollment-tokens",
            &admin,
            json!({"node": "bound-1"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{t}");
    assert_eq!(t["node"], "bound-1");
    let token = t["token"].as_str().unwrap();
    let (s, b) = enroll_with(&api, token, "bound-2").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(
        b["message"].as_str().unwrap().contains("bound to node"),
        "{b}"
    );
    let (s, b) = enroll_with(&api, token, "bound-1").await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _) = api
        .post("/api/v1/agent/heartbeat", &old.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "the bound token replaced it");
    let (s, _) = api
        .post(
            "/api/v1/enrollment-tokens",
            &admin,
            json!({"node": "bound-1", "max_uses": 5}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn enrollment_token_is_single_use_by_default() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let (s, t) = api
        .post("/api/v1/enrollment-tokens", &server.admin_token, json!({}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(t["max_uses"], 1);
    let created: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(t["created_at"].clone()).unwrap();
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(t["expires_at"].clone()).unwrap();
    assert!(
        expires - created <= chrono::Duration::hours(1) + chrono::Duration::seconds(5),
        "a token lives an hour by default: {created} .. {expires}"
    );
    let token = t["token"].as_str().unwrap();
    assert_eq!(
        enroll_with(&api, token, "once-a").await.0,
        StatusCode::CREATED
    );
    let (s, b) = enroll_with(&api, token, "once-b").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b["message"].as_str().unwrap().contains("used up"), "{b}");
}

/// Forty agents racing for a five-use token: exactly five get a credential, the token
/// counts exactly five uses, and the rest are told it is used up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_is_never_used_more_than_its_uses_under_a_race() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let (s, t) = api
        .post(
            "/api/v1/enrollment-tokens",
            &server.admin_token,
            json!({"max_uses": 5}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let token = t["token"].as_str().unwrap().to_string();
    let mut racers = Vec::new();
    for i in 0..40 {
        let api = Api::new(&server);
        let token = token.clone();
        racers.push(tokio::spawn(async move {
            enroll_with(&api, &token, &format!("race-{i}")).await
        }));
    }
    let mut created = 0;
    for r in racers {
        let (s, b) = r.await.unwrap();
        if s == StatusCode::CREATED {
            created += 1;
        } else {
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
            assert!(b["message"].as_str().unwrap().contains("used up"), "{b}");
        }
    }
    assert_eq!(created, 5);
    let (uses,): (i32,) = sqlx::query_as("SELECT uses FROM enrollment_tokens WHERE max_uses = 5")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(uses, 5);
}

/// A token with many uses left is taken a block at a time; what a replica holds and does
/// not hand out goes back to the token within a second, and a revoked token is not
/// honoured from a held block past that second either.
#[tokio::test]
async fn a_fleet_token_is_taken_in_blocks_and_unused_uses_go_back() {
    use heddle_server::token_uses::{BLOCK, HOLD};
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let (_, t) = api
        .post(
            "/api/v1/enrollment-tokens",
            &server.admin_token,
            json!({"max_uses": 1000}),
        )
        .await;
    let token = t["token"].as_str().unwrap().to_string();
    let uses = || async {
        let (uses,): (i32,) =
            sqlx::query_as("SELECT uses FROM enrollment_tokens WHERE max_uses = 1000")
                .fetch_one(&server.state.db)
                .await
                .unwrap();
        uses
    };
    assert_eq!(
        enroll_with(&api, &token, "block-0").await.0,
        StatusCode::CREATED
    );
    assert_eq!(uses().await, BLOCK, "one statement took a block");
    assert_eq!(server.state.token_uses.held(), BLOCK - 1);
    for i in 1..3 {
        let (s, b) = enroll_with(&api, &token, &format!("block-{i}")).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let started = std::time::Instant::now();
    while uses().await != 3 {
        assert!(
            started.elapsed() < HOLD * 5,
            "held uses never went back: {}",
            uses().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.state.token_uses.held(), 0);
    // A block held when the token is revoked serves no enrollment once HOLD has passed.
    assert_eq!(
        enroll_with(&api, &token, "block-3").await.0,
        StatusCode::CREATED
    );
    let id = t["id"].as_str().unwrap();
    let (s, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/enrollment-tokens/{id}"),
            Some(&server.admin_token),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    tokio::time::sleep(HOLD + Duration::from_millis(100)).await;
    let (s, b) = enroll_with(&api, &token, "block-4").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
    assert!(b["message"].as_str().unwrap().contains("revoked"), "{b}");
}

/// A crowd enrolling at once with a fleet token: every block fetch races the others for
/// the token's row, and every enrollment must still get its use.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_token_serves_a_crowd_enrolling_at_once() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let (_, t) = api
        .post(
            "/api/v1/enrollment-tokens",
            &server.admin_token,
            json!({"max_uses": 10_000}),
        )
        .await;
    let token = t["token"].as_str().unwrap().to_string();
    let mut crowd = Vec::new();
    for i in 0..120 {
        let api = Api::new(&server);
        let token = token.clone();
        crowd.push(tokio::spawn(async move {
            enroll_with(&api, &token, &format!("crowd-{i}")).await
        }));
    }
    for c in crowd {
        let (s, b) = c.await.unwrap();
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let started = std::time::Instant::now();
    loop {
        let (uses,): (i32,) =
            sqlx::query_as("SELECT uses FROM enrollment_tokens WHERE max_uses = 10000")
                .fetch_one(&server.state.db)
                .await
                .unwrap();
        if uses == 120 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "uses {uses}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn expired_token_is_refused() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let (_, t) = api
        .post(
            "/api/v1/tokens",
            &admin,
            json!({"name": "short-lived", "role": "viewer", "expires_in_days": 1}),
        )
        .await;
    let viewer = t["token"].as_str().unwrap().to_string();
    assert_eq!(api.get("/api/v1/whoami", &viewer).await.0, StatusCode::OK);
    let enroll_token = server.enrollment_token().await;
    // A day (and an hour) later.
    sqlx::query(
        "UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE name = 'short-lived'",
    )
    .execute(&server.state.db)
    .await
    .unwrap();
    sqlx::query("UPDATE enrollment_tokens SET expires_at = now() - interval '1 second'")
        .execute(&server.state.db)
        .await
        .unwrap();
    let (s, b) = api.get("/api/v1/whoami", &viewer).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let message = b["message"].as_str().unwrap();
    assert!(
        message.contains("\"short-lived\" expired at"),
        "says which token and when: {message}"
    );
    let (s, b) = enroll_with(&api, &enroll_token, "late-node").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b["message"].as_str().unwrap().contains("expired at"), "{b}");
    let (s, b) = api.get("/api/v1/whoami", "hdl_never-issued").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(
        b["message"].as_str().unwrap().contains("unknown token"),
        "{b}"
    );
}

#[tokio::test]
async fn old_admin_token_stops_working_after_rotation() {
    const OLD: &str = "hdl_old-admin-token-0123456789abcdefghijklmnopqrstuvw";
    const NEW: &str = "hdl_new-admin-token-0123456789abcdefghijklmnopqrstuvw";
    let first = TestServer::start_with(|c| c.admin_token = Some(OLD.into())).await;
    let api = Api::new(&first);
    assert_eq!(api.get("/api/v1/whoami", OLD).await.0, StatusCode::OK);
    let db = first.db.clone();
    let url = first.database_url();
    first.stop().await;

    // Restarted with a new HEDDLE_ADMIN_TOKEN.
    let second = TestServer::start_on(&url, |c| c.admin_token = Some(NEW.into())).await;
    let api = Api::new(&second);
    let (s, b) = api.get("/api/v1/whoami", NEW).await;
    assert_eq!(s, StatusCode::OK, "the new admin token works: {b}");
    assert_eq!(b["role"], "admin");
    let (s, b) = api.get("/api/v1/whoami", OLD).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "the old admin token is revoked"
    );
    assert!(b["message"].as_str().unwrap().contains("revoked"), "{b}");
    // Another replica starting with the same value changes nothing.
    let third = TestServer::start_on(&url, |c| c.admin_token = Some(NEW.into())).await;
    assert_eq!(api.get("/api/v1/whoami", NEW).await.0, StatusCode::OK);
    let (s, audit) = api.get("/api/v1/audit?action=token.rotate", NEW).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(audit.as_array().unwrap().len(), 1, "{audit}");
    third.stop().await;
    second.stop().await;
    drop(db);
}

/// A job requeued and claimed again: the first claim's result and progress are refused,
/// the current claim's result is stored once and its retry is still answered 200.
#[tokio::test]
async fn result_from_stale_claim_is_refused() {
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 1).await;
    let api = Api::new(&server);
    let a = enroll(&api, &server, "stale-1").await;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["stale-1"], "max_attempts": 3}))
        .await;
    let (_, first) = claim(&api, &a.credential).await;
    let job = first["job_id"].as_str().unwrap().to_string();
    let stale = first["claim_id"].as_str().unwrap().to_string();
    // The agent goes quiet; the lease lapses and the job is requeued, then claimed again.
    let start = std::time::Instant::now();
    while server.get_run(run.id).await.jobs[0].state.as_str() != "queued" {
        assert!(start.elapsed() < Duration::from_secs(5), "never requeued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, second) = claim(&api, &a.credential).await;
    assert_eq!(second["job_id"], job.as_str());
    let current = second["claim_id"].as_str().unwrap().to_string();
    assert_ne!(stale, current);

    let mut late = result_body("from-first-claim", "succeeded");
    late["claim_id"] = json!(stale);
    let (s, b) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &a.credential,
            late,
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(error_code(&b), "stale_claim");
    assert!(
        b["message"].as_str().unwrap().contains("claimed again"),
        "{b}"
    );
    let (s, b) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/renew"),
            &a.credential,
            json!({"claim_id": stale, "progress": {"message": "old news"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(error_code(&b), "stale_claim");
    assert!(
        server.get_run(run.id).await.jobs[0].progress.is_none(),
        "stale progress is not recorded"
    );

    let mut mine = result_body("from-second-claim", "succeeded");
    mine["claim_id"] = json!(current);
    let url = format!("/api/v1/agent/jobs/{job}/result");
    let (s, b) = api.post(&url, &a.credential, mine.clone()).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = api.post(&url, &a.credential, mine).await;
    assert_eq!(s, StatusCode::OK, "a retried upload stays idempotent: {b}");
    assert_eq!(b["created"], false);
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM results")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn rendezvous_from_non_root_rank_is_refused() {
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 1).await;
    let api = Api::new(&server);
    let r0 = enroll(&api, &server, "rdv-0").await;
    let r1 = enroll(&api, &server, "rdv-1").await;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["rdv-0", "rdv-1"]}))
        .await;
    let path = format!("/api/v1/agent/rendezvous/{}/nccl-id", run.id);
    let blob = |b: &str| json!({"blob_b64": b});
    // Before claiming its job, not even rank 0's agent publishes.
    let (s, b) = api
        .call(Method::PUT, &path, Some(&r0.credential), Some(blob("AAAA")))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(claim(&api, &r0.credential).await.0, StatusCode::OK);
    assert_eq!(claim(&api, &r1.credential).await.0, StatusCode::OK);
    // Rank 1 tries to hand its peers an id of its choosing.
    let (s, b) = api
        .call(
            Method::PUT,
            &path,
            Some(&r1.credential),
            Some(blob("ZXZpbA==")),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("only rank 0"),
        "{b}"
    );
    let (s, b) = api
        .call(Method::PUT, &path, Some(&r0.credential), Some(blob("AAAA")))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let (s, b) = api
        .get(&format!("{path}?timeout_ms=1000"), &r1.credential)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["blob_b64"], "AAAA", "rank 1 reads rank 0's blob");
}
