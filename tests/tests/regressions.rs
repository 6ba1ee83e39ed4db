//! Regressions end to end: agents of five nodes upload a daily NCCL result for four simulated
//! weeks (each day's writes are moved one day into the past before the next day's, so the
//! server sees weeks of history: `a_day_earlier`); half-way one node's driver is updated and
//! its bandwidth drops 7 %, another node's kernel is updated with no effect, and a third has one bad day.
//! Exactly one regression must come out: the updated node's, tied to the driver change, with
//! the fleet saying no node that did not upgrade moved. It shows in the node's health, in
//! `GET /regressions` and in `/metrics`. Per-GPU-pair p2p series: `regressions/p2p.rs`; a
//! series longer than a chart draws: `regressions/long_series.rs`.

#[path = "regressions/long_series.rs"]
mod long_series;
#[path = "regressions/p2p.rs"]
mod p2p;

use heddle_testkit::results::noise;
use heddle_testkit::{Api, TestServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

const DAYS: usize = 28;
const CHANGE_DAY: usize = 14;
const HOSTS: [&str; 5] = ["g1", "g2", "g3", "g4", "g5"];

struct Agent {
    host: &'static str,
    credential: String,
}

/// Moves everything the server remembers of the simulated days one day further back: each
/// result's arrival and its copies in its rows, verdict and series points, the facts
/// history and the change points. (The daily rollups stay where they were made; these tests
/// do not read them.)
async fn a_day_earlier(server: &TestServer) {
    for sql in [
        "UPDATE results SET received_at = received_at - interval '1 day'",
        "UPDATE result_rows SET received_at = received_at - interval '1 day'",
        "UPDATE verdicts SET received_at = received_at - interval '1 day'",
        "UPDATE latest_verdicts SET received_at = received_at - interval '1 day'",
        "UPDATE series_points SET t = t - interval '1 day'",
        "UPDATE node_facts_history SET collected_at = collected_at - interval '1 day'",
        "UPDATE change_points SET t = t - interval '1 day'",
    ] {
        sqlx::query(sql).execute(&server.state.db).await.unwrap();
    }
}

async fn call(
    http: &reqwest::Client,
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let api = Api {
        base: server.url.clone(),
        token: String::new(),
        http: http.clone(),
    };
    let token = (!token.is_empty()).then_some(token);
    api.call(method, path, token, body).await
}

fn facts(host: &str, driver: &str, kernel: &str) -> Value {
    json!({"host": {"hostname": host, "kernel": kernel},
           "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "name": "NVIDIA H100 80GB HBM3"}],
           "software": {"nvidia_driver": driver, "nccl": "2.28.9"}})
}

fn upload(key: &str, busbw: f64) -> Value {
    let gib8 = 8i64 << 30;
    json!({
        "upload_key": key, "outcome": "succeeded", "summary": {"nranks": 2},
        "rows": [
            {"size_bytes": gib8, "op": "all_reduce", "busbw_gbs": busbw, "algbw_gbs": busbw, "time_us": 24795.0, "wrong": 0, "in_place": false},
            {"size_bytes": gib8, "op": "all_reduce", "busbw_gbs": busbw, "algbw_gbs": busbw, "time_us": 24795.0, "wrong": 0, "in_place": true}
        ],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    })
}

/// What the steps of the driver-update test share: the server and five enrolled nodes.
struct Weeks {
    server: TestServer,
    http: reqwest::Client,
    admin: String,
    agents: Vec<Agent>,
}

#[tokio::test]
async fn a_driver_update_that_cost_seven_percent_is_one_regression_tied_to_it() {
    let w = five_nodes().await;
    four_weeks_with_a_driver_update(&w).await;
    let r = one_regression_tied_to_the_driver(&w).await;
    regressions_filtered(&w).await;
    series_chart(&w.http, &w.server, &w.admin, &r).await;
    health_and_metrics_name_it(&w).await;
    an_expectation_of_more_noise_closes_it(&w, &r).await;
}

/// Five nodes enrolled, with the same driver and kernel.
async fn five_nodes() -> Weeks {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    let admin = server.admin_token.clone();
    let put = reqwest::Method::PUT;
    let post = reqwest::Method::POST;
    let mut agents = Vec::new();
    for host in HOSTS {
        let token = server.enrollment_token().await;
        let (s, body) = call(
            &http,
            &server,
            post.clone(),
            "/api/v1/agent/enroll",
            "",
            Some(json!({"enroll_token": token, "hostname": host, "agent_version": "test"})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
        let credential = body["credential"].as_str().unwrap().to_string();
        let (s, body) = call(
            &http,
            &server,
            put.clone(),
            "/api/v1/agent/facts",
            &credential,
            Some(facts(host, "550.54.15", "6.8.0-45")),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        agents.push(Agent { host, credential });
    }
    Weeks {
        server,
        http,
        admin,
        agents,
    }
}

/// A result a day per node for four weeks: half-way g1's driver is updated and its
/// bandwidth drops 7 %, g5's kernel is updated with no effect, and g2 has one bad day.
async fn four_weeks_with_a_driver_update(w: &Weeks) {
    let Weeks {
        server,
        http,
        agents,
        ..
    } = w;
    let put = reqwest::Method::PUT;
    let post = reqwest::Method::POST;
    for day in 0..DAYS {
        a_day_earlier(server).await;
        if day == CHANGE_DAY {
            for (i, driver, kernel) in [(0, "560.28.03", "6.8.0-45"), (4, "550.54.15", "6.8.0-49")]
            {
                let a: &Agent = &agents[i];
                let (s, body) = call(
                    http,
                    server,
                    put.clone(),
                    "/api/v1/agent/facts",
                    &a.credential,
                    Some(facts(a.host, driver, kernel)),
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{body}");
            }
        }
        for (n, a) in agents.iter().enumerate() {
            let mut busbw = 360.0 * noise(day, n);
            if n == 0 && day >= CHANGE_DAY {
                busbw *= 0.93;
            }
            if n == 1 && day == 20 {
                busbw *= 0.6;
            }
            let run = server
                .start_run(
                    json!({"kind": "nccl", "params": {"op": "all_reduce"}, "nodes": [a.host]}),
                )
                .await;
            let (s, lease) = call(
                http,
                server,
                post.clone(),
                "/api/v1/agent/jobs/claim",
                &a.credential,
                None,
            )
            .await;
            assert_eq!(s, StatusCode::OK, "{lease}");
            let job = lease["job_id"].as_str().unwrap();
            let (s, up) = call(
                http,
                server,
                post.clone(),
                &format!("/api/v1/agent/jobs/{job}/result"),
                &a.credential,
                Some(upload(&format!("{}-{day}", a.host), busbw)),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED, "{up} (run {})", run.id);
        }
    }
}

/// Exactly one regression, g1's, tied to its driver update, with the fleet saying no node
/// that did not upgrade moved. Returns it.
async fn one_regression_tied_to_the_driver(w: &Weeks) -> Value {
    let Weeks {
        server,
        http,
        admin,
        ..
    } = w;
    let (s, open) = call(
        http,
        server,
        reqwest::Method::GET,
        "/api/v1/regressions",
        admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{open}");
    let open = open.as_array().unwrap();
    assert_eq!(open.len(), 1, "{open:#?}");
    let r = &open[0];
    assert_eq!(r["hostname"], "g1");
    assert_eq!(r["test"], "nccl.all_reduce");
    assert_eq!(r["metric"], "busbw_gbs");
    assert_eq!(r["worse"], true);
    assert_eq!(r["open"], true);
    let change = r["relative_change"].as_f64().unwrap();
    assert!((change + 0.07).abs() < 0.015, "{r:#}");
    assert!(r["ci_high"].as_f64().unwrap() < 0.0, "{r:#}");
    assert_eq!(r["points_before"], CHANGE_DAY);
    assert_eq!(r["points_after"], DAYS - CHANGE_DAY);
    // The change sits on the first result after the update: CHANGE_DAY days before the
    // last day, give or take the day's seconds.
    let t = chrono::DateTime::parse_from_rfc3339(r["t"].as_str().unwrap()).unwrap();
    let days_ago = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_hours() as f64 / 24.0;
    assert!(
        (days_ago - (DAYS - 1 - CHANGE_DAY) as f64).abs() < 0.5,
        "{days_ago}"
    );
    assert_eq!(
        r["facts_changes"],
        json!([{"field": "software.nvidia_driver", "before": "550.54.15", "after": "560.28.03"}])
    );
    let fleet = &r["fleet"];
    assert_eq!(fleet["moved"], 1, "{fleet:#}");
    assert_eq!(fleet["compared"], HOSTS.len(), "{fleet:#}");
    assert_eq!(fleet["shared"][0]["moved_with_change"], 1, "{fleet:#}");
    assert_eq!(fleet["shared"][0]["unmoved_with_change"], 0, "{fleet:#}");
    assert_eq!(fleet["shared"][0]["unmoved"], HOSTS.len() - 1, "{fleet:#}");
    let summary = r["summary"].as_str().unwrap();
    println!("{summary}");
    assert!(
        summary.contains("software.nvidia_driver 550.54.15 → 560.28.03"),
        "{summary}"
    );
    r.clone()
}

async fn regressions_filtered(w: &Weeks) {
    let Weeks {
        server,
        http,
        admin,
        ..
    } = w;
    for (q, n) in [
        ("?node=g1", 1),
        ("?node=g2", 0),
        ("?kind=nccl", 1),
        ("?kind=rdma", 0),
        ("?kind=nccl.all_reduce", 1),
    ] {
        let (s, found) = call(
            http,
            server,
            reqwest::Method::GET,
            &format!("/api/v1/regressions{q}"),
            admin,
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{found}");
        assert_eq!(found.as_array().unwrap().len(), n, "{q}: {found:#}");
    }
    let (s, found) = call(
        http,
        server,
        reqwest::Method::GET,
        "/api/v1/regressions?node=nope",
        admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{found}");
}

/// The node's health warns with the regression; the others' does not mention one; the
/// fleet's health and `/metrics` name it.
async fn health_and_metrics_name_it(w: &Weeks) {
    let Weeks {
        server,
        http,
        admin,
        ..
    } = w;
    let (s, health) = call(
        http,
        server,
        reqwest::Method::GET,
        "/api/v1/nodes/g1/health",
        admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{health}");
    let codes: Vec<&str> = health["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["code"].as_str())
        .collect();
    assert_eq!(codes, ["regression"], "{health:#}");
    assert_eq!(health["reasons"][0]["severity"], "warn");
    for host in ["g2", "g5"] {
        let (_, health) = call(
            http,
            server,
            reqwest::Method::GET,
            &format!("/api/v1/nodes/{host}/health"),
            admin,
            None,
        )
        .await;
        assert!(
            health["reasons"].as_array().unwrap().is_empty(),
            "{host}: {health:#}"
        );
    }
    let (_, fleet) = call(
        http,
        server,
        reqwest::Method::GET,
        "/api/v1/health",
        admin,
        None,
    )
    .await;
    let g1 = fleet["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["hostname"] == "g1")
        .unwrap();
    assert!(
        g1["failing"]
            .as_array()
            .unwrap()
            .contains(&json!("regression")),
        "{fleet:#}"
    );

    let metrics = http
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("heddle_regressions_open{Hostname=\"g1\",test=\"nccl.all_reduce\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("heddle_regressions_open{Hostname=\"g2\",test=\"nccl.all_reduce\"} 0"),
        "{metrics}"
    );
}

/// An operator who calls 7 % noise for this node's NCCL tests raises the minimum effect:
/// the series' next result closes the regression `r`.
async fn an_expectation_of_more_noise_closes_it(w: &Weeks, r: &Value) {
    let Weeks {
        server,
        http,
        admin,
        agents,
    } = w;
    let post = reqwest::Method::POST;
    // An operator who calls 7 % noise for this node's NCCL tests raises the minimum effect:
    // the series' next result closes the regression.
    let (s, body) = call(
        http,
        server,
        post.clone(),
        "/api/v1/expectations",
        admin,
        Some(
            json!({"test": "nccl", "metric": "regression_min_change", "value": 1.5, "source": "x"}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (s, body) = call(
        http,
        server,
        post.clone(),
        "/api/v1/expectations",
        admin,
        Some(
            json!({"test": "nccl", "metric": "regression_min_change", "value": 0.1, "node": "g1",
                    "source": "g1's NCCL varies by 5 % from day to day"}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    server
        .start_run(json!({"kind": "nccl", "params": {"op": "all_reduce"}, "nodes": ["g1"]}))
        .await;
    let (_, lease) = call(
        http,
        server,
        post.clone(),
        "/api/v1/agent/jobs/claim",
        &agents[0].credential,
        None,
    )
    .await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, up) = call(
        http,
        server,
        post.clone(),
        &format!("/api/v1/agent/jobs/{job}/result"),
        &agents[0].credential,
        Some(upload("g1-last", 360.0 * 0.93)),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
    let (_, open) = call(
        http,
        server,
        reqwest::Method::GET,
        "/api/v1/regressions",
        admin,
        None,
    )
    .await;
    assert_eq!(open, json!([]));
    // The series keeps its points; its change is gone with the regression.
    let (s, chart) = call(
        http,
        server,
        reqwest::Method::GET,
        &series_path("g1", r, ""),
        admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{chart}");
    assert_eq!(chart["total_points"], DAYS + 1);
    assert_eq!(chart["change_points"], json!([]), "{chart:#}");
}

/// `GET /regressions/series` of regression `r`'s series, with `extra` query parameters.
fn series_path(host: &str, r: &Value, extra: &str) -> String {
    format!(
        "/api/v1/regressions/series?node={host}&test={}&metric={}&band={}&world_size={}{extra}",
        r["test"].as_str().unwrap(),
        r["metric"].as_str().unwrap(),
        r["size_band"],
        r["world_size"]
    )
}

fn time(v: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap())
        .unwrap()
        .with_timezone(&chrono::Utc)
}

/// The regressed series' chart: every day's point, the change at the first lower one, the
/// driver update as a marker just before it; ranges cut all three; a kernel update with no
/// effect is a marker on its node's chart and nothing else.
async fn series_chart(http: &reqwest::Client, server: &TestServer, admin: &str, r: &Value) {
    let get = |path: String| async move {
        call(http, server, reqwest::Method::GET, &path, admin, None).await
    };
    assert_eq!(r["world_size"], 1, "{r:#}");
    let (s, chart) = get(series_path("g1", r, "")).await;
    assert_eq!(s, StatusCode::OK, "{chart}");
    assert_eq!(chart["hostname"], "g1");
    assert_eq!(
        (chart["total_points"].clone(), chart["stride"].clone()),
        (json!(DAYS), json!(1))
    );
    let points = chart["points"].as_array().unwrap();
    assert_eq!(points.len(), DAYS);
    for (day, p) in points.iter().enumerate() {
        let v = p["value"].as_f64().unwrap();
        let level = if day < CHANGE_DAY {
            360.0
        } else {
            360.0 * 0.93
        };
        assert!((v / level - 1.0).abs() < 0.011, "day {day}: {p}");
        assert!(p["run_id"].is_string() && p["result_id"].is_string(), "{p}");
    }
    let cps = chart["change_points"].as_array().unwrap();
    assert_eq!(cps.len(), 1, "{chart:#}");
    assert_eq!(cps[0]["id"], r["id"]);
    assert_eq!(cps[0]["open"], true);
    let t = time(&cps[0]["t"]);
    assert_eq!(time(&points[CHANGE_DAY]["t"]), t);
    let markers = chart["facts_markers"].as_array().unwrap();
    assert_eq!(markers.len(), 1, "{chart:#}");
    assert_eq!(
        markers[0]["changes"],
        json!([{"field": "software.nvidia_driver", "before": "550.54.15", "after": "560.28.03"}])
    );
    // The update arrived the change's day, before its result and after the day before's.
    let marked = time(&markers[0]["t"]);
    assert!(
        marked <= t && marked > time(&points[CHANGE_DAY - 1]["t"]),
        "{chart:#}"
    );

    // From the change on: its points and the change, not the update just before it.
    let since = t
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        .replace('+', "%2B");
    let (s, after) = get(series_path("g1", r, &format!("&since={since}"))).await;
    assert_eq!(s, StatusCode::OK, "{after}");
    assert_eq!(after["points"].as_array().unwrap().len(), DAYS - CHANGE_DAY);
    assert_eq!(after["change_points"].as_array().unwrap().len(), 1);
    assert_eq!(after["facts_markers"], json!([]));
    // Up to just before it: the days before and the update (stored moments before the
    // change's result), no change.
    let until = (t - chrono::Duration::microseconds(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let (s, before) = get(series_path("g1", r, &format!("&until={until}"))).await;
    assert_eq!(s, StatusCode::OK, "{before}");
    assert_eq!(before["points"].as_array().unwrap().len(), CHANGE_DAY);
    assert_eq!(before["change_points"], json!([]));
    assert_eq!(before["facts_markers"].as_array().unwrap().len(), 1);

    let (s, g5) = get(series_path("g5", r, "")).await;
    assert_eq!(s, StatusCode::OK, "{g5}");
    assert_eq!(g5["change_points"], json!([]));
    assert_eq!(
        g5["facts_markers"][0]["changes"],
        json!([{"field": "host.kernel", "before": "6.8.0-45", "after": "6.8.0-49"}])
    );

    // Refusals: a range that ends before it starts, a series or node that does not exist,
    // a pair of a series without pairs.
    let (s, body) = get(series_path(
        "g1",
        r,
        &format!("&since={since}&until={until}"),
    ))
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    for other in [
        series_path("g1", r, "").replace("busbw_gbs", "algbw_gbs"),
        series_path("g1", r, "").replace("world_size=1", "world_size=2"),
    ] {
        let (s, body) = get(other.clone()).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{other}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("no such series"),
            "{body}"
        );
    }
    let (s, body) = get(series_path("nope", r, "")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    let (s, body) = get(series_path("g1", r, "&pair=0-1")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    let (s, body) = get("/api/v1/regressions/series?node=g1".into()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
}
