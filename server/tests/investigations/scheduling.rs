//! Each batch of an investigation started exactly once, whatever advances it at once,
//! and a pair nobody claims failed after its deadline.

use super::*;

/// Many advances at once, on top of the replica's own loop: each batch is still started
/// exactly once (the row lock with SKIP LOCKED, re-read under the lock).
#[tokio::test]
async fn concurrent_advances_start_each_batch_once() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    let hosts = ["race-a", "race-b", "race-c", "race-d", "race-e", "race-f"];
    for h in hosts {
        enroll(&api, &server, h).await;
    }
    let (s, body) = api
        .post(
            "/api/v1/investigations",
            &token,
            json!({"nodes": hosts, "kind": "nccl", "batch_size": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let db = server.state.db.clone();
    for _ in 0..200 {
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let db = db.clone();
                tokio::spawn(
                    async move { heddle_server::investigate::advance_all(&db).await.unwrap() },
                )
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // The running pair ends at once, with nothing left for the next advance to collect,
        // so the advances race straight to starting the next batch.
        sqlx::query("UPDATE investigation_pairs SET state = 'failed', error = 'ended by the test' WHERE investigation_id = $1 AND state = 'running'")
            .bind(id)
            .execute(&db)
            .await
            .unwrap();
        if investigation(&api, &token, id).await.state != InvestigationState::Running {
            break;
        }
    }
    let inv = investigation(&api, &token, id).await;
    assert_eq!(
        inv.state,
        InvestigationState::Failed,
        "no pair produced a figure"
    );
    assert_eq!(inv.error.as_deref(), Some("no pair produced a figure"));
    assert_eq!(inv.pairs.len(), 15);
    assert!(
        inv.pairs.iter().all(|p| p
            .error
            .as_deref()
            .is_some_and(|e| e.contains("ended by the test"))),
        "{:?}",
        inv.pairs
    );
    let (labelled,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE label LIKE $1")
        .bind(format!("investigation {id}:%"))
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(labelled, 15, "every batch started once");
    assert_eq!(inv.analysis.verdict, Conclusion::Inconclusive);
}

#[tokio::test]
async fn a_pair_nobody_claims_fails_after_the_deadline() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    // Enrolled, then silent: their agents are down.
    for h in ["down-a", "down-b"] {
        enroll(&api, &server, h).await;
    }
    let (s, body) = api
        .post(
            "/api/v1/investigations",
            &token,
            json!({"nodes": ["down-a", "down-b"], "kind": "nccl"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        investigation(&api, &token, id).await.state,
        InvestigationState::Running,
        "within the deadline it waits"
    );
    // The deadline passes.
    let deadline = heddle_server::investigate::PAIR_CLAIM_DEADLINE.as_secs() as f64 + 1.0;
    sqlx::query("UPDATE jobs SET created_at = created_at - make_interval(secs => $1) WHERE state = 'queued'")
        .bind(deadline)
        .execute(&server.state.db)
        .await
        .unwrap();
    let inv = wait_done(&api, &token, id).await;
    assert_eq!(inv.state, InvestigationState::Failed);
    let error = inv.pairs[0].error.as_deref().unwrap();
    assert!(
        error.contains("not claimed within 600 s: is the agent of down-a running?"),
        "{error}"
    );
    let (queued,): (i64,) = sqlx::query_as("SELECT count(*) FROM jobs WHERE state = 'queued'")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(queued, 0, "nothing left waiting for the silent agents");
}
