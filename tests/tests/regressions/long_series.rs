//! A series longer than a chart draws, seeded straight into Postgres.

use heddle_server::testing::TestServer;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{call, time};

/// A series longer than a chart draws: 2,500 results a quarter of an hour apart (26 days),
/// seeded straight into Postgres with their series points, come back as every third point
/// counted back from the newest (834 of them), and a range of the last 100 as all of them.
/// With a year of daily rollups before them (as retention leaves), the whole history and a
/// year are drawn a day a point, and a short range of those days too.
#[tokio::test]
async fn a_long_series_is_thinned_to_the_charts_bound() {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    let db = &server.state.db;
    points_every_quarter_hour_for_26_days(db).await;
    recent_points_are_thinned(&http, &server).await;
    a_year_before_them_is_drawn_by_day(&http, &server).await;
}

/// The series `points_every_quarter_hour_for_26_days` makes.
const LONG_SERIES: &str = "/api/v1/regressions/series?node=long-1&test=nccl.all_reduce&metric=busbw_gbs&band=33&world_size=1";

/// The admin's `GET path` of a chart.
async fn chart(http: &reqwest::Client, server: &TestServer, path: String) -> (StatusCode, Value) {
    call(
        http,
        server,
        reqwest::Method::GET,
        &path,
        &server.admin_token,
        None,
    )
    .await
}

/// `t` as a query parameter.
fn since(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// 2,500 results of node long-1, a quarter of an hour apart up to now, the value of each
/// its rank, with each day's rollup.
async fn points_every_quarter_hour_for_26_days(db: &sqlx::PgPool) {
    sqlx::query("SELECT history_ensure_partitions(current_date - 420, current_date + 31)")
        .execute(db)
        .await
        .unwrap();
    sqlx::query(
        "WITH n AS (INSERT INTO nodes (id, hostname) VALUES (gen_random_uuid(), 'long-1') RETURNING id),
              run AS (INSERT INTO runs (id, spec, created_by) VALUES (gen_random_uuid(), '{\"kind\": \"nccl\"}', 'test')
                      RETURNING id),
              js AS (INSERT INTO jobs (id, run_id, node_id, rank, world_size, state, max_attempts)
                     SELECT gen_random_uuid(), run.id, n.id, i, 1, 'succeeded', 1 FROM run, n, generate_series(0, 2499) i
                     RETURNING id, run_id, node_id, rank),
              res AS (INSERT INTO results (id, job_id, upload_key, outcome, started_at, finished_at, received_at)
                      SELECT gen_random_uuid(), js.id, 'long-' || js.rank, 'succeeded', now(), now(),
                             now() - make_interval(mins => 15 * (2499 - js.rank))
                      FROM js RETURNING id, job_id, received_at),
              v AS (INSERT INTO verdicts (result_id, received_at, run_id, node_id, test, verdict, world_size, figures)
                    SELECT res.id, res.received_at, js.run_id, js.node_id, 'nccl.all_reduce', 'pass', 1,
                           jsonb_build_array(jsonb_build_object('test', 'nccl.all_reduce', 'metric', 'busbw_gbs',
                               'size_bytes', 8589934592, 'band', 33, 'value', js.rank))
                    FROM res JOIN js ON js.id = res.job_id)
         INSERT INTO series_points (node_id, test, metric, band, world_size, pair, t, value, result_id)
         SELECT js.node_id, 'nccl.all_reduce', 'busbw_gbs', 33, 1, '', res.received_at, js.rank, res.id
         FROM res JOIN js ON js.id = res.job_id",
    )
    .execute(db)
    .await
    .unwrap();
    // Each day the points fall in, rolled up.
    sqlx::query(
        "INSERT INTO series_daily (node_id, test, metric, band, world_size, pair, day, n, sum, min, max, median, recent)
         SELECT node_id, test, metric, band, world_size, pair, (t AT TIME ZONE 'UTC')::date, count(*), sum(value),
                min(value), max(value), percentile_cont(0.5) WITHIN GROUP (ORDER BY value), '{}'
         FROM series_points GROUP BY 1, 2, 3, 4, 5, 6, 7",
    )
    .execute(db)
    .await
    .unwrap();
}

/// The chart of the 2,500 points draws every third; since a time, every one after it.
async fn recent_points_are_thinned(http: &reqwest::Client, server: &TestServer) {
    let path = LONG_SERIES;
    let get = |path: String| chart(http, server, path);
    let asked = std::time::Instant::now();
    let (s, chart) = get(path.to_string()).await;
    println!(
        "regressions: a chart of 2,500 points thinned to 834 answered in {:.1} ms",
        asked.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(s, StatusCode::OK, "{chart}");
    assert_eq!(chart["resolution"], "points", "{chart}");
    assert_eq!(
        (chart["total_points"].clone(), chart["stride"].clone()),
        (json!(2500), json!(3))
    );
    // The value is the result's rank: 0, 3, 6, ... 2499, the newest.
    let values: Vec<f64> = chart["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_f64().unwrap())
        .collect();
    assert_eq!(values.len(), 834);
    let want: Vec<f64> = (0..834).map(|i| (3 * i) as f64).collect();
    assert_eq!(values, want);
    let p = &chart["points"][833];
    assert!(
        p["run_id"].is_string() && p["result_id"].is_string() && p.get("n").is_none(),
        "{p}"
    );
    let newest = time(&p["t"]);
    let (s, last) = get(format!(
        "{path}&since={}",
        since(newest - chrono::Duration::minutes(15 * 99))
    ))
    .await;
    assert_eq!(s, StatusCode::OK, "{last}");
    assert_eq!(
        (last["total_points"].clone(), last["stride"].clone()),
        (json!(100), json!(1))
    );
    assert_eq!(last["points"][0]["value"], 2400.0);
}

/// A year of days before the points, as rollups alone: day d ago has 2 figures, 1000 + d
/// and 1002 + d. The chart is drawn by day, a year of it too; ten days long ago are its
/// rollups.
async fn a_year_before_them_is_drawn_by_day(http: &reqwest::Client, server: &TestServer) {
    let db = &server.state.db;
    let path = LONG_SERIES;
    let get = |path: String| chart(http, server, path);
    sqlx::query(
        "INSERT INTO series_daily (node_id, test, metric, band, world_size, pair, day, n, sum, min, max, median, recent)
         SELECT n.id, 'nccl.all_reduce', 'busbw_gbs', 33, 1, '', current_date - d, 2, 2002 + 2 * d, 1000 + d,
                1002 + d, 1001 + d, '{}'
         FROM nodes n, generate_series(30, 399) d WHERE n.hostname = 'long-1'
           AND current_date - d < (SELECT min(day) FROM series_daily)",
    )
    .execute(db)
    .await
    .unwrap();
    let days: i64 = sqlx::query_scalar("SELECT count(*) FROM series_daily")
        .fetch_one(db)
        .await
        .unwrap();
    let (s, all) = get(path.to_string()).await;
    assert_eq!(s, StatusCode::OK, "{all}");
    assert_eq!(all["resolution"], "days", "{all}");
    assert_eq!(
        (all["total_points"].clone(), all["stride"].clone()),
        (json!(days), json!(1))
    );
    let first = &all["points"][0];
    assert_eq!(
        (
            first["value"].clone(),
            first["n"].clone(),
            first["min"].clone(),
            first["max"].clone()
        ),
        (json!(1400.0), json!(2), json!(1399.0), json!(1401.0)),
        "{first}"
    );
    assert!(
        first.get("result_id").is_none() && first.get("run_id").is_none(),
        "{first}"
    );
    // The newest day is today's rollup of the newest points.
    let today = all["points"].as_array().unwrap().last().unwrap();
    assert_eq!(today["max"], 2499.0, "{today}");
    let year_ago = chrono::Utc::now() - chrono::Duration::days(365);
    let (s, year) = get(format!("{path}&since={}", since(year_ago))).await;
    assert_eq!(s, StatusCode::OK, "{year}");
    assert_eq!(year["resolution"], "days", "{year}");
    let in_year: i64 = sqlx::query_scalar("SELECT count(*) FROM series_daily WHERE day >= $1")
        .bind(year_ago.date_naive())
        .fetch_one(db)
        .await
        .unwrap();
    assert_eq!(
        year["points"].as_array().unwrap().len() as i64,
        in_year,
        "{year}"
    );
    assert!(in_year > 300, "{in_year}");
    // Ten days long ago: short, but its points are gone; its rollups are drawn.
    let (s, old) = get(format!(
        "{path}&since={}&until={}",
        since(chrono::Utc::now() - chrono::Duration::days(100)),
        since(chrono::Utc::now() - chrono::Duration::days(91))
    ))
    .await;
    assert_eq!(s, StatusCode::OK, "{old}");
    assert_eq!(old["resolution"], "days", "{old}");
    assert_eq!(old["total_points"], 10, "{old}");
}
