//! Several replicas share the reconciler's work: each stale node is evaluated once, and the
//! merged traits follow the one conflict rule.

mod common;

use std::time::{Duration, Instant};

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

/// Inserts `n` nodes whose facts are `fixture`'s, each with its own hostname.
async fn seed_nodes(db: &sqlx::PgPool, fixture: &str, n: usize) {
    let base = fixture_facts(fixture);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO nodes (id, hostname, facts, facts_sha256) ",
        );
        qb.push_values(chunk, |mut b, i| {
            let mut facts = base.clone();
            facts["host"]["hostname"] = Value::String(format!("replica-{i:05}"));
            let sha = heddle_types::facts_sha256(&facts);
            b.push_bind(Uuid::new_v4())
                .push_bind(format!("replica-{i:05}"))
                .push_bind(facts)
                .push_bind(sha);
        });
        qb.build().execute(db).await.unwrap();
    }
}

async fn upload_and_enable(api: &Api, admin: &str, name: &str) {
    let (s, v) = api
        .raw(
            Method::POST,
            &format!("/api/v1/plugins/{name}/versions/0.1.0"),
            Some(admin),
            "application/wasm",
            dist(name),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = api
        .post(&format!("/api/v1/plugins/{name}/enable"), admin, json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

async fn count(db: &sqlx::PgPool, sql: &str) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sql).fetch_one(db).await.unwrap();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_evaluate_each_node_once() {
    const NODES: usize = 1500;
    let first = TestServer::start_with(|c| c.heartbeat_interval_s = 3600).await;
    let second =
        TestServer::start_on(&first.database_url(), |c| c.heartbeat_interval_s = 3600).await;
    let db = first.state.db.clone();
    seed_nodes(&db, "dgx1", NODES).await;
    let api = Api::new(&first);
    // Enabling wakes the first replica's own reconciler; both replicas also reconcile by hand
    // at the same time, so three loops race for the same stale nodes.
    upload_and_enable(&api, &first.admin_token, "dgx-affinity").await;
    let (a, b) = tokio::join!(reconcile(&first.state), reconcile(&second.state),);
    let (a, b) = (a.unwrap(), b.unwrap());
    let started = Instant::now();
    while count(&db, "SELECT count(*) FROM plugin_results").await < NODES as i64 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not every node was evaluated"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let any loop still holding a batch finish before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let evaluated = first.state.plugins.evaluated_nodes() + second.state.plugins.evaluated_nodes();
    assert_eq!(
        evaluated, NODES as u64,
        "each node once across replicas (by hand: {a} on the first, {b} on the second)"
    );
    assert!(a + b > 0 && a + b <= NODES, "{a} + {b}");
    // Every node got its one result, its recommendations and its traits.
    assert_eq!(
        count(
            &db,
            "SELECT count(DISTINCT node_id) FROM plugin_results WHERE error IS NULL"
        )
        .await,
        NODES as i64
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(DISTINCT node_id) FROM recommendations WHERE plugin_id IS NOT NULL"
        )
        .await,
        NODES as i64
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM nodes WHERE traits = '{}'::jsonb").await,
        0
    );
    // Nothing is left for either replica.
    assert_eq!(reconcile(&second.state).await.unwrap(), 0);
    assert_eq!(reconcile(&first.state).await.unwrap(), 0);
    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traits_are_merged_by_the_rule_of_env_recommendations() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    seed_nodes(&server.state.db, "runai-roce", 1).await;
    upload_and_enable(&api, &admin, "runai-roce").await;
    let started = Instant::now();
    let node = loop {
        let (_, n) = api.get("/api/v1/nodes/replica-00000", &admin).await;
        if n["traits"]["orchestrator"] == "runai" {
            break n;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no traits: {n}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(node["traits"]["orchestrator"], "runai", "{node}");
    // An operator's own set outranks every plugin, though its source ("a-survey") sorts
    // before "plugin:runai-roce".
    let (s, b) = api
        .call(
            Method::PUT,
            "/api/v1/nodes/replica-00000/recommendations",
            Some(&admin),
            Some(json!({"source": "a-survey", "traits": {"orchestrator": "slurm"}, "items": []})),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let (_, n) = api.get("/api/v1/nodes/replica-00000", &admin).await;
    assert_eq!(n["traits"]["orchestrator"], "slurm", "{n}");
    // Its plugin's other traits stay.
    let plugin_keys = node["traits"].as_object().unwrap().len();
    assert_eq!(n["traits"].as_object().unwrap().len(), plugin_keys, "{n}");
    // Removing the operator's set gives the plugin's value back.
    api.call(
        Method::PUT,
        "/api/v1/nodes/replica-00000/recommendations",
        Some(&admin),
        Some(json!({"source": "a-survey", "items": []})),
    )
    .await;
    let (_, n) = api.get("/api/v1/nodes/replica-00000", &admin).await;
    assert_eq!(n["traits"]["orchestrator"], "runai", "{n}");
    server.stop().await;
}

async fn wait_for(db: &sqlx::PgPool, sql: &str, want: i64, what: &str) {
    let started = Instant::now();
    while count(db, sql).await != want {
        assert!(started.elapsed() < Duration::from_secs(60), "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reconciler finds its work through `nodes.plugins_due`: set for a node inserted with
/// facts, for new facts and for every node when the plugin set changes; cleared once the
/// node is evaluated. A flag that went missing is found by the minute's sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_due_are_flagged_evaluated_and_swept_when_the_flag_is_missed() {
    const DUE: &str = "SELECT count(*) FROM plugins_due_nodes";
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 3600).await;
    let db = server.state.db.clone();
    let api = Api::new(&server);
    seed_nodes(&db, "dgx1", 20).await;
    assert_eq!(count(&db, DUE).await, 20, "inserted with facts: due");
    upload_and_enable(&api, &server.admin_token, "dgx-affinity").await;
    wait_for(&db, DUE, 0, "the reconciler left nodes due").await;
    assert_eq!(count(&db, "SELECT count(*) FROM plugin_results").await, 20);

    // New facts: that node alone is due, and evaluated on them.
    sqlx::query("UPDATE nodes SET facts_sha256 = 'changed' WHERE hostname = 'replica-00003'")
        .execute(&db)
        .await
        .unwrap();
    let fresh = "SELECT count(*) FROM plugin_results r JOIN nodes n ON n.id = r.node_id
                 WHERE r.facts_sha256 = n.facts_sha256";
    assert!(count(&db, DUE).await <= 1);
    reconcile(&server.state).await.unwrap();
    wait_for(&db, fresh, 20, "the changed node was not evaluated again").await;
    assert_eq!(count(&db, DUE).await, 0);

    // A flag lost after new facts: nothing finds the node until the sweep flags it.
    sqlx::query("UPDATE nodes SET facts_sha256 = 'again' WHERE hostname = 'replica-00004'")
        .execute(&db)
        .await
        .unwrap();
    sqlx::query("UPDATE nodes SET plugins_due = false")
        .execute(&db)
        .await
        .unwrap();
    assert_eq!(reconcile(&server.state).await.unwrap(), 0);
    assert_eq!(count(&db, fresh).await, 19);
    assert_eq!(heddle_server::plugins::sweep(&db).await.unwrap(), 1);
    reconcile(&server.state).await.unwrap();
    wait_for(&db, fresh, 20, "the swept node was not evaluated").await;
    assert_eq!(heddle_server::plugins::sweep(&db).await.unwrap(), 0);

    // A plugin change makes every node due; the disabled plugin's results go.
    let (s, v) = api
        .post(
            "/api/v1/plugins/dgx-affinity/disable",
            &server.admin_token,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reconcile(&server.state).await.unwrap();
    wait_for(
        &db,
        "SELECT count(*) FROM plugin_results",
        0,
        "a disabled plugin's results stayed",
    )
    .await;
    wait_for(&db, DUE, 0, "nodes stayed due after the plugin went").await;
    server.stop().await;
}

/// A plugin disabled while a batch that read the old plugin set is on its way to the
/// database: the batch must not mark its nodes as evaluated against the new set, or the
/// disabled plugin's results stay on them until the sweep a minute later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_disabled_during_a_batch_leaves_its_nodes_due() {
    const DUE: &str = "SELECT count(*) FROM plugins_due_nodes";
    const DISABLED_RESULTS: &str = "SELECT count(*) FROM plugin_results r
        JOIN plugins p ON p.id = r.plugin_id WHERE p.name = 'azure-nd'";
    let server = TestServer::start_with(|c| c.heartbeat_interval_s = 3600).await;
    let db = server.state.db.clone();
    let api = Api::new(&server);
    seed_nodes(&db, "dgx1", 20).await;
    upload_and_enable(&api, &server.admin_token, "dgx-affinity").await;
    upload_and_enable(&api, &server.admin_token, "azure-nd").await;
    wait_for(&db, DUE, 0, "the reconciler left nodes due").await;
    assert_eq!(count(&db, DISABLED_RESULTS).await, 20);

    // New facts on every node; the batch that evaluates them is held at its first write.
    let mut blocker = db.begin().await.unwrap();
    sqlx::query("LOCK TABLE plugin_results IN EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    sqlx::query("UPDATE nodes SET facts_sha256 = facts_sha256 || '-new'")
        .execute(&db)
        .await
        .unwrap();
    let state = server.state.clone();
    let batch = tokio::spawn(async move { reconcile(&state).await });
    const WAITING: &str = "SELECT count(*) FROM pg_stat_activity
        WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let started = Instant::now();
    while count(&db, WAITING).await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no batch reached its write"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The plugin goes while that batch, which ran it, waits; then the batch is let through.
    let (s, v) = api
        .post(
            "/api/v1/plugins/azure-nd/disable",
            &server.admin_token,
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    blocker.rollback().await.unwrap();
    batch.await.unwrap().unwrap();
    wait_for(&db, WAITING, 0, "a batch still waits").await;

    // The batch left its nodes due, so a pass takes the disabled plugin's results away, long
    // before the sweep, which is a minute off. (Marked current, they kept them.)
    reconcile(&server.state).await.unwrap();
    let started = Instant::now();
    while count(&db, DISABLED_RESULTS).await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the disabled plugin's results stayed on the batch's nodes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for(&db, DUE, 0, "nodes stayed due").await;
    server.stop().await;
}
