//! Regressions end to end: agents of five nodes upload a daily NCCL result for four simulated
//! weeks (each day's writes are moved one day into the past before the next day's, so the
//! server sees weeks of history: `a_day_earlier`); half-way one node's driver is updated and
//! its bandwidth drops 7 %, another node's kernel is updated with no effect, and a third has one bad day.
//! Exactly one regression must come out: the updated node's, tied to the driver change, with
//! the fleet saying no node that did not upgrade moved. It shows in the node's health, in
//! `GET /regressions` and in `/metrics`. Per-GPU-pair p2p series: `regressions/p2p.rs`.

#[path = "regressions/p2p.rs"]
mod p2p;

use heddle_server::testing::TestServer;
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
    let mut req = http.request(method, format!("{}{path}", server.url));
    if !token.is_empty() {
        req = req.bearer_auth(token);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn facts(host: &str, driver: &str, kernel: &str) -> Value {
    json!({"host": {"hostname": host, "kernel": kernel},
           "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "name": "NVIDIA H100 80GB HBM3"}],
           "software": {"nvidia_driver": driver, "nccl": "2.28.9"}})
}

/// A deterministic wobble of about ±1 %.
fn noise(day: usize, node: usize) -> f64 {
    let h = ((day * 31 + node * 17) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    1.0 + 0.02 * ((h % 1000) as f64 / 1000.0 - 0.5)
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

#[tokio::test]
async fn a_driver_update_that_cost_seven_percent_is_one_regression_tied_to_it() {
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
    for day in 0..DAYS {
        a_day_earlier(&server).await;
        if day == CHANGE_DAY {
            for (i, driver, kernel) in [(0, "560.28.03", "6.8.0-45"), (4, "550.54.15", "6.8.0-49")]
            {
                let a: &Agent = &agents[i];
                let (s, body) = call(
                    &http,
                    &server,
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
                &http,
                &server,
                post.clone(),
                "/api/v1/agent/jobs/claim",
                &a.credential,
                None,
            )
            .await;
            assert_eq!(s, StatusCode::OK, "{lease}");
            let job = lease["job_id"].as_str().unwrap();
            let (s, up) = call(
                &http,
                &server,
                post.clone(),
                &format!("/api/v1/agent/jobs/{job}/result"),
                &a.credential,
                Some(upload(&format!("{}-{day}", a.host), busbw)),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED, "{up} (run {})", run.id);
        }
    }

    let (s, open) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/api/v1/regressions",
        &admin,
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

    // Filters.
    for (q, n) in [
        ("?node=g1", 1),
        ("?node=g2", 0),
        ("?kind=nccl", 1),
        ("?kind=rdma", 0),
        ("?kind=nccl.all_reduce", 1),
    ] {
        let (s, found) = call(
            &http,
            &server,
            reqwest::Method::GET,
            &format!("/api/v1/regressions{q}"),
            &admin,
            None,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{found}");
        assert_eq!(found.as_array().unwrap().len(), n, "{q}: {found:#}");
    }
    let (s, found) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/api/v1/regressions?node=nope",
        &admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{found}");

    // The node's health warns with the regression; the others' does not mention one.
    let (s, health) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/api/v1/nodes/g1/health",
        &admin,
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
            &http,
            &server,
            reqwest::Method::GET,
            &format!("/api/v1/nodes/{host}/health"),
            &admin,
            None,
        )
        .await;
        assert!(
            health["reasons"].as_array().unwrap().is_empty(),
            "{host}: {health:#}"
        );
    }
    let (_, fleet) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/api/v1/health",
        &admin,
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
    // An operator who calls 7 % noise for this node's NCCL tests raises the minimum effect:
    // the series' next result closes the regression.
    let (s, body) = call(
        &http,
        &server,
        post.clone(),
        "/api/v1/expectations",
        &admin,
        Some(
            json!({"test": "nccl", "metric": "regression_min_change", "value": 1.5, "source": "x"}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (s, body) = call(
        &http,
        &server,
        post.clone(),
        "/api/v1/expectations",
        &admin,
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
        &http,
        &server,
        post.clone(),
        "/api/v1/agent/jobs/claim",
        &agents[0].credential,
        None,
    )
    .await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, up) = call(
        &http,
        &server,
        post.clone(),
        &format!("/api/v1/agent/jobs/{job}/result"),
        &agents[0].credential,
        Some(upload("g1-last", 360.0 * 0.93)),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
    let (_, open) = call(
        &http,
        &server,
        reqwest::Method::GET,
        "/api/v1/regressions",
        &admin,
        None,
    )
    .await;
    assert_eq!(open, json!([]));
}
