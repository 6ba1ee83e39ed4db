//! History at scale (docs/health.md, "History"), against a real Postgres: the partitioning
//! migration on a database that has rows, months created ahead by the maintenance loop,
//! retention dropping an expired month while the node's latest verdict and its open
//! regression stay readable, rollups equal to the aggregates of their points, and the
//! regression detector reading `series_points`.

mod common;
#[path = "history/migration.rs"]
mod migration;

use std::time::Duration;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use common::*;
use heddle_server::history::{self, SeriesKey, partitions, points};
use heddle_server::testing::{TestDb, TestServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::{Connection, Executor};
use uuid::Uuid;

const GIB: i64 = 1 << 30;
const TABLES: [&str; 5] = [
    "results",
    "result_rows",
    "verdicts",
    "series_points",
    "series_daily",
];

/// An 8 GiB all_reduce of `busbw` (one figure: busbw_gbs, band 33).
fn nccl_upload(key: &str, busbw: f64) -> Value {
    json!({
        "upload_key": key, "outcome": "succeeded", "summary": {"nranks": 2},
        "rows": [
            {"size_bytes": 8 * GIB, "op": "all_reduce", "busbw_gbs": busbw, "algbw_gbs": busbw, "time_us": 24795.0, "wrong": 0, "in_place": false},
            {"size_bytes": 8 * GIB, "op": "all_reduce", "busbw_gbs": busbw, "algbw_gbs": busbw, "time_us": 24795.0, "wrong": 0, "in_place": true}
        ],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    })
}

/// A deterministic wobble of about ±1 %.
fn noise(i: usize) -> f64 {
    let h = ((i * 31 + 7) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    1.0 + 0.02 * ((h % 1000) as f64 / 1000.0 - 0.5)
}

/// Runs an all_reduce on `host` and uploads `busbw` as its result; returns the result's id.
async fn upload(api: &Api, server: &TestServer, agent: &FakeAgent, host: &str, busbw: f64) -> Uuid {
    server
        .start_run(json!({"kind": "nccl", "params": {"op": "all_reduce"}, "nodes": [host]}))
        .await;
    let lease = agent.claim(api).await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, up) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &agent.credential,
            nccl_upload(&Uuid::new_v4().to_string(), busbw),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
    up["result_id"].as_str().unwrap().parse().unwrap()
}

/// Enrolls a node with two H100s in its facts.
async fn gpu_agent(api: &Api, server: &TestServer, host: &str) -> FakeAgent {
    let agent = enroll(api, server, host).await;
    let facts = json!({"host": {"hostname": host},
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "name": "NVIDIA H100 80GB HBM3"}]});
    let (s, body) = api
        .call(
            reqwest::Method::PUT,
            "/api/v1/agent/facts",
            Some(&agent.credential),
            Some(facts),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    agent
}

/// Twelve results of one node, the last six 10 % lower: one open regression.
async fn regressed_node(api: &Api, server: &TestServer, host: &str) -> (FakeAgent, Vec<Uuid>) {
    let agent = gpu_agent(api, server, host).await;
    let mut ids = Vec::new();
    for i in 0..12 {
        let level = if i < 6 { 360.0 } else { 324.0 };
        ids.push(upload(api, server, &agent, host, level * noise(i)).await);
    }
    (agent, ids)
}

async fn count(db: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(db).await.unwrap()
}

fn first_of_month(d: NaiveDate, months_later: i32) -> NaiveDate {
    let m = d.year() * 12 + d.month0() as i32 + months_later;
    NaiveDate::from_ymd_opt(m.div_euclid(12), m.rem_euclid(12) as u32 + 1, 1).unwrap()
}

#[tokio::test]
async fn months_are_created_ahead_and_again_when_missing() {
    let server = TestServer::start_with(|c| c.history_interval_s = 1).await;
    let db = &server.state.db;
    let today = Utc::now().date_naive();
    for table in TABLES {
        let months = partitions::months(db, table).await.unwrap();
        for ahead in 0..=partitions::MONTHS_AHEAD {
            let month = first_of_month(today, ahead);
            assert!(months.contains(&month), "{table} lacks {month}: {months:?}");
        }
        // Rows moved back within the raw retention still find their month.
        let reach = first_of_month(today - chrono::Duration::days(90), 0);
        assert!(months.contains(&reach), "{table} lacks {reach}: {months:?}");
    }
    let last = first_of_month(today, partitions::MONTHS_AHEAD);
    let name = format!("results_p{}", last.format("%Y%m"));
    db.execute(format!("DROP TABLE {name}").as_str())
        .await
        .unwrap();
    assert!(
        !partitions::months(db, "results")
            .await
            .unwrap()
            .contains(&last)
    );
    let mut again = false;
    for _ in 0..100 {
        if partitions::months(db, "results")
            .await
            .unwrap()
            .contains(&last)
        {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(again, "the maintenance loop did not create {name} again");
}

#[tokio::test]
async fn retention_drops_an_expired_month_and_keeps_the_latest_verdict_and_open_regression() {
    let server = TestServer::start_with(|c| c.history_interval_s = 1).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let db = &server.state.db;
    let (agent, _) = regressed_node(&api, &server, "old-1").await;
    let (s, open) = api.get("/api/v1/regressions", &admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(open.as_array().unwrap().len(), 1, "{open:#}");

    // All of it happened 150 days ago: its month has expired under the default 90 days. One
    // transaction, so the maintenance loop finds the month only with its rows in it.
    let mut tx = db.begin().await.unwrap();
    for sql in [
        "SELECT history_ensure_partitions(current_date - 200, current_date)",
        "UPDATE results SET received_at = received_at - interval '150 days'",
        "UPDATE result_rows SET received_at = received_at - interval '150 days'",
        "UPDATE verdicts SET received_at = received_at - interval '150 days', judged_at = judged_at - interval '150 days'",
        "UPDATE latest_verdicts SET received_at = received_at - interval '150 days', judged_at = judged_at - interval '150 days'",
        "UPDATE series_points SET t = t - interval '150 days'",
        "UPDATE series_daily SET day = day - 150",
        "UPDATE change_points SET t = t - interval '150 days'",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    // Moving a result to another month is not deleting it: what hangs on it moved along.
    for (table, column, n) in [
        ("results", "received_at", 12),
        ("result_rows", "received_at", 24),
        ("verdicts", "received_at", 12),
        ("series_points", "t", 12),
    ] {
        let moved: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE {column} < now() - interval '100 days'"
        ))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(moved, n, "{table}");
    }
    tx.commit().await.unwrap();
    let month = first_of_month((Utc::now() - chrono::Duration::days(150)).date_naive(), 0);
    let mut gone = false;
    for _ in 0..200 {
        let left = count(db, "SELECT count(*) FROM results").await;
        if left == 0
            && !partitions::months(db, "verdicts")
                .await
                .unwrap()
                .contains(&month)
        {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the month of {month} was not dropped");
    for table in ["results", "result_rows", "verdicts", "series_points"] {
        assert!(
            !partitions::months(db, table)
                .await
                .unwrap()
                .contains(&month),
            "{table}"
        );
        assert_eq!(
            count(db, &format!("SELECT count(*) FROM {table}")).await,
            0,
            "{table}"
        );
    }
    // Rollups are kept three years.
    assert!(
        partitions::months(db, "series_daily")
            .await
            .unwrap()
            .contains(&month)
    );
    let key: SeriesKey =
        sqlx::query_as("SELECT node_id, test, metric, band, world_size, pair FROM series_daily")
            .fetch_one(db)
            .await
            .unwrap();
    let year = history::range(
        db,
        &key,
        Some(Utc::now() - chrono::Duration::days(365)),
        Utc::now(),
        1000,
    )
    .await
    .unwrap();
    assert_eq!(year.resolution, history::range::Resolution::Days);
    let year = year.buckets;
    assert_eq!(year.len(), 1, "{year:?}");
    assert_eq!(year[0].n, 12);

    // The node's latest verdict, its open regression and the fleet view still read.
    let (s, health) = api.get("/api/v1/nodes/old-1/health", &admin).await;
    assert_eq!(s, StatusCode::OK, "{health}");
    assert_eq!(health["tests"][0]["test"], "nccl.all_reduce", "{health:#}");
    let codes: Vec<&str> = health["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["code"].as_str())
        .collect();
    assert!(codes.contains(&"regression"), "{health:#}");
    let (_, fleet) = api.get("/api/v1/health", &admin).await;
    let line = &fleet["nodes"][0];
    assert_eq!(line["hostname"], "old-1", "{fleet:#}");
    assert!(line["last_judged_at"].is_string(), "{fleet:#}");
    assert!(
        line["failing"]
            .as_array()
            .unwrap()
            .contains(&json!("regression")),
        "{fleet:#}"
    );
    let metrics = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("heddle_history_partitions_dropped_total{table=\"results\"}")),
        "{metrics}"
    );

    // A new result starts the series' points again; the change found in the dropped month
    // stays open, since nothing newer says otherwise.
    upload(&api, &server, &agent, "old-1", 324.0).await;
    let (_, open) = api.get("/api/v1/regressions", &admin).await;
    assert_eq!(open.as_array().unwrap().len(), 1, "{open:#}");
    assert_eq!(open[0]["hostname"], "old-1");
}

/// The day's 64 newest values' median, as `series_daily.median` means it.
fn median_of_newest(values: &[f64]) -> f64 {
    let mut v = values[values.len().saturating_sub(64)..].to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[tokio::test]
async fn rollups_equal_the_aggregates_of_their_points() {
    let test_db = TestDb::create().await;
    let db = sqlx::PgPool::connect(&test_db.url).await.unwrap();
    let node = Uuid::new_v4();
    sqlx::query("INSERT INTO nodes (id, hostname) VALUES ($1, 'r1')")
        .bind(node)
        .execute(&db)
        .await
        .unwrap();
    let key = |test: &str, metric: &str| SeriesKey {
        node_id: node,
        test: test.into(),
        metric: metric.into(),
        band: 33,
        world_size: 1,
        pair: String::new(),
    };
    let yesterday = (Utc::now() - chrono::Duration::days(1)).date_naive();
    let at = |day: NaiveDate, minute: i64| -> DateTime<Utc> {
        day.and_hms_opt(0, 0, 0).unwrap().and_utc() + chrono::Duration::minutes(minute)
    };
    // 70 results yesterday (more than the 64 the median looks at), 3 today; each with a
    // bandwidth and a latency figure.
    let mut judged: Vec<(Uuid, DateTime<Utc>, f64)> = Vec::new();
    for i in 0..73 {
        let t = if i < 70 {
            at(yesterday, i)
        } else {
            at(yesterday.succ_opt().unwrap(), i)
        };
        judged.push((
            Uuid::new_v4(),
            t,
            300.0 + ((i * 37) % 11) as f64 + 0.25 * i as f64,
        ));
    }
    let record = |id: Uuid, t: DateTime<Utc>, v: f64| {
        let db = db.clone();
        async move {
            let figures = json!([
                {"test": "nccl.all_reduce", "metric": "busbw_gbs", "size_bytes": 8 * GIB, "band": 33, "value": v},
                {"test": "nccl.all_reduce", "metric": "time_us", "size_bytes": 8 * GIB, "band": 33, "value": 1e6 / v},
            ]);
            let mut tx = db.begin().await.unwrap();
            points::record(
                &mut tx,
                &points::Judged {
                    node_id: node,
                    result_id: id,
                    received_at: t,
                    world_size: 1,
                    figures: &figures,
                },
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    };
    for &(id, t, v) in &judged {
        record(id, t, v).await;
    }
    // Judged again with another figure: its point is replaced, its day computed again.
    judged[5].2 = 250.0;
    record(judged[5].0, judged[5].1, judged[5].2).await;

    let check = |judged: Vec<(Uuid, DateTime<Utc>, f64)>| {
        let db = db.clone();
        async move {
            for (metric, f) in [("busbw_gbs", 1.0), ("time_us", -1.0)] {
                let until = Utc::now() + chrono::Duration::days(1);
                let long = history::range(
                    &db,
                    &key("nccl.all_reduce", metric),
                    Some(at(yesterday, 0) - chrono::Duration::days(40)),
                    until,
                    1000,
                )
                .await
                .unwrap();
                assert_eq!(long.resolution, history::range::Resolution::Days);
                let long = long.buckets;
                assert_eq!(long.len(), 2, "{long:?}");
                for (day, bucket) in [yesterday, yesterday.succ_opt().unwrap()]
                    .into_iter()
                    .zip(&long)
                {
                    let values: Vec<f64> = judged
                        .iter()
                        .filter(|j| j.1.date_naive() == day)
                        .map(|j| if f > 0.0 { j.2 } else { 1e6 / j.2 })
                        .collect();
                    let n = values.len() as f64;
                    assert_eq!(bucket.t, at(day, 0));
                    assert_eq!(bucket.n, values.len() as i64, "{metric} {day}");
                    assert!(
                        (bucket.mean - values.iter().sum::<f64>() / n).abs() < 1e-9,
                        "{metric} {day}"
                    );
                    assert_eq!(bucket.min, values.iter().copied().fold(f64::MAX, f64::min));
                    assert_eq!(bucket.max, values.iter().copied().fold(f64::MIN, f64::max));
                    assert!(
                        (bucket.median - median_of_newest(&values)).abs() < 1e-9,
                        "{metric} {day}: {} {}",
                        bucket.median,
                        median_of_newest(&values)
                    );
                }
                // A short range reads the points themselves.
                let short = history::range(
                    &db,
                    &key("nccl.all_reduce", metric),
                    Some(at(yesterday, 0)),
                    until,
                    1000,
                )
                .await
                .unwrap();
                assert_eq!(short.resolution, history::range::Resolution::Points);
                assert_eq!((short.total, short.stride), (73, 1));
                let short = short.buckets;
                assert_eq!(short.len(), 73);
                assert!(short.iter().all(|b| b.n == 1 && b.result_id.is_some()));
                assert_eq!(short[5].mean, if f > 0.0 { 250.0 } else { 1e6 / 250.0 });
            }
        }
    };
    check(judged.clone()).await;
    // Computed again from the points, the rollups are the same.
    let before: Vec<(String, NaiveDate, i64, f64, f64, f64)> = sqlx::query_as(
        "SELECT metric, day, n, min, max, median FROM series_daily ORDER BY metric, day",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    let mut conn = db.acquire().await.unwrap();
    for day in [yesterday, yesterday.succ_opt().unwrap()] {
        points::roll_up_day(&mut conn, node, day).await.unwrap();
    }
    drop(conn);
    let after: Vec<(String, NaiveDate, i64, f64, f64, f64)> = sqlx::query_as(
        "SELECT metric, day, n, min, max, median FROM series_daily ORDER BY metric, day",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(before, after);
    check(judged).await;
    db.close().await;
}

#[tokio::test]
async fn the_detector_reads_series_points() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let db = &server.state.db;
    let agent = gpu_agent(&api, &server, "pts-1").await;
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(upload(&api, &server, &agent, "pts-1", 360.0 * noise(i)).await);
    }
    let (_, open) = api.get("/api/v1/regressions", &admin).await;
    assert_eq!(open.as_array().unwrap().len(), 0, "{open:#}");
    // The last six points 10 % lower in series_points only: the verdicts' figures are flat.
    sqlx::query("UPDATE series_points SET value = value * 0.9 WHERE result_id = ANY($1)")
        .bind(&ids[6..])
        .execute(db)
        .await
        .unwrap();
    let found = heddle_server::health::regress::on_result(db, ids[11])
        .await
        .unwrap();
    assert_eq!(found, 1);
    let (_, open) = api.get("/api/v1/regressions", &admin).await;
    assert_eq!(open.as_array().unwrap().len(), 1, "{open:#}");
    let change = open[0]["relative_change"].as_f64().unwrap();
    assert!((change + 0.10).abs() < 0.02, "{open:#}");
    let flat: Vec<(f64,)> = sqlx::query_as(
        "SELECT (figures->0->>'value')::float8 FROM verdicts WHERE result_id = ANY($1)",
    )
    .bind(&ids[6..])
    .fetch_all(db)
    .await
    .unwrap();
    assert!(flat.iter().all(|(v,)| *v > 350.0), "{flat:?}");
}
