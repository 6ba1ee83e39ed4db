//! The job store against a real database: each move takes a job only from the states the
//! table allows, and a move the table refuses changes nothing.

mod common;

use common::*;
use heddle_server::jobs::{JobError, Move, store};
use heddle_server::testing::TestServer;
use heddle_types::jobs::{JobState, RunState};
use serde_json::json;
use uuid::Uuid;

async fn job_state(db: &sqlx::PgPool, job: Uuid) -> String {
    sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test]
async fn moves_follow_the_table() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = enroll(&api, &server, "moves-1").await;
    let (node, agent_id) = (
        agent.node_id.parse::<Uuid>().unwrap(),
        agent.agent_id.parse::<Uuid>().unwrap(),
    );
    let db = &server.state.db;
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 1}, "nodes": ["moves-1"]}))
        .await;
    assert_eq!(run.state, RunState::Queued);
    let job = run.jobs[0].id;
    let mut conn = db.acquire().await.unwrap();

    // Renewing a job nobody claimed is refused and leaves it queued.
    let err = store::renew(&mut conn, job, agent_id, None, None, 30.0)
        .await
        .unwrap_err();
    assert!(matches!(err, JobError::Conflict(_)), "{err}");
    assert_eq!(job_state(db, job).await, "queued");

    let lease = store::claim(&mut conn, node, agent_id, 30.0)
        .await
        .unwrap()
        .expect("a queued job");
    assert_eq!((lease.id, lease.attempts), (job, 1));
    assert_eq!(job_state(db, job).await, "leased");
    // Nothing else is queued on the node.
    assert!(
        store::claim(&mut conn, node, agent_id, 30.0)
            .await
            .unwrap()
            .is_none()
    );

    // Cancelling the run asks the claimed job to stop but leaves its state to its agent.
    assert_eq!(
        store::cancel_runs(&mut conn, &[run.id], "test")
            .await
            .unwrap(),
        0
    );
    let (_, cancel) = store::renew(&mut conn, job, agent_id, Some(lease.claim_id), None, 30.0)
        .await
        .unwrap();
    assert!(cancel, "the renewal carries the cancel");
    assert_eq!(job_state(db, job).await, "running");

    // A result that says succeeded ends it, but a job with a result takes no second one:
    // the table refuses, and the row stays as it was.
    let mut tx = db.begin().await.unwrap();
    let ended = store::finish(
        &mut tx,
        job,
        JobState::Running,
        JobState::Succeeded,
        chrono::Utc::now(),
        None,
    )
    .await
    .unwrap();
    assert_eq!(ended, JobState::Succeeded);
    tx.commit().await.unwrap();
    let mut tx = db.begin().await.unwrap();
    let err = store::finish(
        &mut tx,
        job,
        JobState::Succeeded,
        JobState::Failed,
        chrono::Utc::now(),
        Some("again"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, JobError::Illegal(m) if m.by == Move::Finish),
        "{err}"
    );
    drop(tx);
    assert_eq!(job_state(db, job).await, "succeeded");
    assert_eq!(server.get_run(run.id).await.state, RunState::Succeeded);

    // An ended job is never expired, renewed or claimed again.
    assert!(
        store::expire_leases(&mut conn, std::time::Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store::renew(&mut conn, job, agent_id, Some(lease.claim_id), None, 30.0)
            .await
            .is_err()
    );
    assert!(
        store::claim(&mut conn, node, agent_id, 30.0)
            .await
            .unwrap()
            .is_none()
    );
}
