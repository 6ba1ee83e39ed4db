//! The agent's protocol client against a real server: the answers the life cycle relies
//! on (idempotent uploads, conflicts, lost leases, rendezvous, revocation).
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::time::Duration;

use chrono::Utc;
use heddle_agent::client::{Client, ClientError, RenewOutcome, UploadOutcome};
use heddle_server::testing::TestServer;
use heddle_types::agent::{EnrollRequest, HeartbeatRequest, LeaseRenew};
use heddle_types::jobs::{Outcome, Progress, ResultUpload};
use uuid::Uuid;

const HOST: &str = "client-node";

async fn enrolled(server: &TestServer) -> (Client, Uuid) {
    let client = Client::new(std::slice::from_ref(&server.url)).unwrap();
    let resp = client
        .enroll(&EnrollRequest {
            enroll_token: server.enrollment_token().await,
            hostname: HOST.into(),
            agent_version: Some("test".into()),
            pending_ticket: None,
        })
        .await
        .unwrap()
        .enrolled()
        .expect("a new host name enrolls at once");
    client.set_credential(resp.credential);
    (client, resp.agent_id)
}

fn upload(key: &str, outcome: Outcome) -> ResultUpload {
    let now = Utc::now();
    ResultUpload {
        upload_key: key.into(),
        outcome,
        reason: None,
        exit_code: Some(0),
        stderr_tail: None,
        summary: serde_json::json!({}),
        rows: vec![],
        started_at: now,
        finished_at: now,
        claim_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_is_idempotent_and_conflicts_are_definitive() {
    let server = TestServer::start().await;
    let (client, _) = enrolled(&server).await;
    let bad_token = Client::new(std::slice::from_ref(&server.url)).unwrap();
    let err = bad_token
        .enroll(&EnrollRequest {
            enroll_token: "hde_not-a-token".into(),
            hostname: HOST.into(),
            agent_version: None,
            pending_ticket: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err}");

    assert!(
        client.claim().await.unwrap().is_none(),
        "nothing queued yet"
    );
    let run = server
        .start_run(serde_json::json!({"kind": "sleep", "params": {"seconds": 1}, "nodes": [HOST]}))
        .await;
    let lease = client.claim().await.unwrap().expect("a job for this node");
    assert_eq!(lease.run_id, run.id);
    assert_eq!(lease.spec.kind, "sleep");

    let progress = LeaseRenew {
        progress: Some(Progress {
            fraction: Some(0.5),
            message: "half".into(),
        }),
        claim_id: Some(lease.claim_id),
    };
    match client.renew(lease.job_id, &progress, None).await.unwrap() {
        RenewOutcome::Renewed(r) => assert!(!r.cancel),
        other => panic!("{other:?}"),
    }

    let key = Uuid::new_v4().to_string();
    match client
        .upload_result(lease.job_id, &upload(&key, Outcome::Succeeded))
        .await
        .unwrap()
    {
        UploadOutcome::Stored(a) => assert!(a.created),
        other => panic!("{other:?}"),
    }
    // The same key again (a retry after a lost answer): stored before, not again.
    match client
        .upload_result(lease.job_id, &upload(&key, Outcome::Succeeded))
        .await
        .unwrap()
    {
        UploadOutcome::Stored(a) => assert!(!a.created),
        other => panic!("{other:?}"),
    }
    // Another key for a job that has a result: conflict, which the spool treats as final.
    let other = Uuid::new_v4().to_string();
    assert!(matches!(
        client
            .upload_result(lease.job_id, &upload(&other, Outcome::Failed))
            .await
            .unwrap(),
        UploadOutcome::Conflict(_)
    ));
    assert!(matches!(
        client
            .upload_result(Uuid::new_v4(), &upload(&other, Outcome::Failed))
            .await
            .unwrap(),
        UploadOutcome::UnknownJob(_)
    ));
    // The job is finished: its lease is gone.
    assert!(matches!(
        client
            .renew(lease.job_id, &LeaseRenew::default(), None)
            .await
            .unwrap(),
        RenewOutcome::LeaseLost(_)
    ));
    let results = reqwest::Client::new()
        .get(format!("{}/api/v1/runs/{}/results", server.url, run.id))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap()
        .json::<Vec<serde_json::Value>>()
        .await
        .unwrap();
    assert_eq!(results.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendezvous_round_trip_and_timeout() {
    let server = TestServer::start().await;
    let (client, _) = enrolled(&server).await;
    let run = server
        .start_run(serde_json::json!({"kind": "sleep", "params": {"seconds": 1}, "nodes": [HOST]}))
        .await;
    let blob = [0u8, 1, 2, 254, 255];
    // A client without a credential is refused.
    let waiter = Client::new(std::slice::from_ref(&server.url)).unwrap();
    assert!(matches!(
        waiter
            .rendezvous_get(run.id, "nccl-id", Duration::from_millis(100))
            .await,
        Err(ClientError::Unauthorized { .. })
    ));
    let missing = client
        .rendezvous_get(run.id, "nobody-posts-this", Duration::from_millis(200))
        .await
        .unwrap();
    assert!(missing.is_none());
    // Rank 0 publishes while it holds its job's claim.
    client.claim().await.unwrap().expect("the run's job");
    client
        .rendezvous_put(run.id, "nccl-id", &blob)
        .await
        .unwrap();
    let got = client
        .rendezvous_get(run.id, "nccl-id", Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some(&blob[..]));
    assert!(matches!(
        client.rendezvous_put(run.id, "../x", &blob).await,
        Err(ClientError::BadName(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_credential_is_unauthorized() {
    let server = TestServer::start().await;
    let (client, agent_id) = enrolled(&server).await;
    let hb = client
        .heartbeat(&HeartbeatRequest::default())
        .await
        .unwrap();
    assert!(hb.send_facts, "a new node has no facts yet");
    let status = reqwest::Client::new()
        .delete(format!("{}/api/v1/agents/{agent_id}", server.url))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 204);
    let err = client
        .heartbeat(&HeartbeatRequest::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err}");
    assert!(!err.is_transient());
}
