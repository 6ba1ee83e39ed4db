//! Per-GPU-pair series: two 3-GPU nodes upload a daily `p2p` result for four simulated
//! weeks. Every node's slowest copy is GPU 1 → GPU 0 (a PCIe hop); half-way, the copy GPU 0
//! → GPU 1 of `p1` and GPU 0 → GPU 2 of `p2` lose 10 %, still faster than the slowest, so
//! the worst pair's figure the verdict judges does not move. Exactly one regression per
//! node must come out, on exactly that pair, each node the only one of its pair's cohort
//! that moved; the verdicts stay what they were.

use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{CHANGE_DAY, DAYS, a_day_earlier, call, noise};

const GPUS: usize = 3;
/// The node and the copy on it that slows down.
const SLOWED: [(&str, &str); 2] = [("p1", "0-1"), ("p2", "0-2")];
const SIZE: i64 = 256 << 20;

fn facts(host: &str) -> Value {
    let gpus: Vec<Value> = (0..GPUS)
        .map(|i| json!({"index": i, "name": "NVIDIA H100 80GB HBM3"}))
        .collect();
    json!({"host": {"hostname": host, "kernel": "6.8.0-45"}, "gpus": gpus,
           "software": {"nvidia_driver": "550.54.15"}})
}

/// GB/s of a copy on a healthy node: 1300 within a GPU, 300 from GPU 1 to GPU 0, 370
/// between the other GPUs, 52 to and from the host.
fn healthy(src: &str, dst: &str) -> f64 {
    match (src, dst) {
        ("host", _) | (_, "host") => 52.0,
        (s, d) if s == d => 1300.0,
        ("1", "0") => 300.0,
        _ => 370.0,
    }
}

/// A day's rows, as the p2p runner writes them.
fn rows(node: usize, day: usize) -> Vec<Value> {
    let gpus: Vec<String> = (0..GPUS).map(|g| g.to_string()).collect();
    let mut copies: Vec<(&str, &str, &str)> = Vec::new();
    for s in &gpus {
        for d in &gpus {
            copies.push(("d2d", s, d));
        }
    }
    for g in &gpus {
        copies.push(("h2d", "host", g));
        copies.push(("d2h", g, "host"));
    }
    copies
        .iter()
        .enumerate()
        .map(|(i, &(kind, src, dst))| {
            let mut gbs = healthy(src, dst) * noise(day, node * 100 + i);
            if day >= CHANGE_DAY && format!("{src}-{dst}") == SLOWED[node].1 {
                gbs *= 0.9;
            }
            let path = match (kind, src == dst) {
                ("d2d", true) => "local",
                ("d2d", false) => "p2p",
                _ => "pinned",
            };
            json!({"size_bytes": SIZE, "op": kind, "algbw_gbs": gbs,
                   "time_us": SIZE as f64 / gbs / 1e3, "wrong": 0,
                   "labels": {"src": src, "dst": dst, "kind": kind, "path": path}})
        })
        .collect()
}

/// What the steps of the pair test share: the server and the two nodes' credentials.
struct Pairs {
    server: TestServer,
    http: reqwest::Client,
    admin: String,
    credentials: Vec<String>,
}

#[tokio::test]
async fn a_pair_that_lost_ten_percent_is_one_regression_on_that_pair() {
    let p = two_nodes().await;
    let last_runs = four_weeks_with_a_slowed_pair(&p).await;
    one_regression_per_node_on_its_pair(&p).await;
    a_pairs_chart_is_that_copys_alone(&p).await;
    verdicts_judge_the_worst_pair(&p, &last_runs).await;
    health_and_metrics_name_the_pair(&p).await;
}

async fn two_nodes() -> Pairs {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    let admin = server.admin_token.clone();
    let mut credentials = Vec::new();
    for (host, _) in SLOWED {
        let token = server.enrollment_token().await;
        let (s, body) = call(
            &http,
            &server,
            Method::POST,
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
            Method::PUT,
            "/api/v1/agent/facts",
            &credential,
            Some(facts(host)),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        credentials.push(credential);
    }
    Pairs {
        server,
        http,
        admin,
        credentials,
    }
}

/// A day's p2p result per node for four weeks; returns the last day's runs.
async fn four_weeks_with_a_slowed_pair(p: &Pairs) -> Vec<uuid::Uuid> {
    let Pairs {
        server,
        http,
        credentials,
        ..
    } = p;
    let mut last_runs = Vec::new();
    for day in 0..DAYS {
        a_day_earlier(server).await;
        last_runs.clear();
        for (n, (host, _)) in SLOWED.iter().enumerate() {
            let run = server
                .start_run(json!({"kind": "p2p", "params": {"size": SIZE}, "nodes": [host]}))
                .await;
            let (s, lease) = call(
                http,
                server,
                Method::POST,
                "/api/v1/agent/jobs/claim",
                &credentials[n],
                None,
            )
            .await;
            assert_eq!(s, StatusCode::OK, "{lease}");
            let job = lease["job_id"].as_str().unwrap();
            let upload = json!({
                "upload_key": format!("{host}-{day}"), "outcome": "succeeded",
                "summary": {"kind": "p2p"}, "rows": rows(n, day),
                "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
            });
            let (s, up) = call(
                http,
                server,
                Method::POST,
                &format!("/api/v1/agent/jobs/{job}/result"),
                &credentials[n],
                Some(upload),
            )
            .await;
            assert_eq!(s, StatusCode::CREATED, "{up}");
            last_runs.push(run.id);
        }
    }
    last_runs
}

/// One open regression per node, each on its slowed pair, and no other change at all:
/// not on the other pairs, not on the worst pair's series the verdict judges.
async fn one_regression_per_node_on_its_pair(p: &Pairs) {
    let Pairs {
        server,
        http,
        admin,
        ..
    } = p;
    let (s, all) = call(
        http,
        server,
        Method::GET,
        "/api/v1/regressions?all=true",
        admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{all}");
    let all = all.as_array().unwrap();
    let mut found: Vec<(&str, &str, &str)> = all
        .iter()
        .map(|r| {
            (
                r["hostname"].as_str().unwrap(),
                r["test"].as_str().unwrap(),
                r["pair"].as_str().unwrap_or("(none)"),
            )
        })
        .collect();
    found.sort();
    assert_eq!(
        found,
        [("p1", "p2p.d2d", "0-1"), ("p2", "p2p.d2d", "0-2")],
        "{all:#?}"
    );
    for r in all {
        assert_eq!(r["open"], true, "{r:#}");
        assert_eq!(r["metric"], "algbw_gbs");
        assert_eq!(r["size_band"], 28);
        let change = r["relative_change"].as_f64().unwrap();
        assert!((change + 0.10).abs() < 0.015, "{r:#}");
        assert!((r["before"].as_f64().unwrap() - 370.0).abs() < 5.0, "{r:#}");
        assert_eq!(r["points_before"], CHANGE_DAY);
        assert_eq!(r["points_after"], DAYS - CHANGE_DAY);
        // The cohort is the same pair on other nodes: the other node has that pair's
        // figures on both sides and did not move on it (it moved on another pair).
        let fleet = &r["fleet"];
        assert_eq!(
            (fleet["compared"].as_i64(), fleet["moved"].as_i64()),
            (Some(2), Some(1)),
            "{fleet:#}"
        );
        assert_eq!(fleet["moved_nodes"], json!([r["hostname"]]), "{fleet:#}");
        let summary = r["summary"].as_str().unwrap();
        let pair = r["pair"].as_str().unwrap();
        assert!(
            summary.contains(&format!(
                "p2p.d2d algbw_gbs (pair {pair}, band 2^28, 1 node)"
            )),
            "{summary}"
        );
    }
}

/// The chart of a pair's series is that copy's alone: p1's slowed pair with its change,
/// its copy within GPU 0 without one, and the worst pair's series (no pair) level too.
async fn a_pairs_chart_is_that_copys_alone(p: &Pairs) {
    let Pairs {
        server,
        http,
        admin,
        ..
    } = p;
    for (pair, level, changes) in [
        ("&pair=0-1", 370.0, 1),
        ("&pair=0-0", 1300.0, 0),
        ("", 300.0, 0),
    ] {
        let path = format!(
            "/api/v1/regressions/series?node=p1&test=p2p.d2d&metric=algbw_gbs&band=28&world_size=1{pair}"
        );
        let (s, chart) = call(http, server, Method::GET, &path, admin, None).await;
        assert_eq!(s, StatusCode::OK, "{path}: {chart}");
        assert_eq!(
            chart["pair"].as_str(),
            pair.strip_prefix("&pair="),
            "{path}"
        );
        let points = chart["points"].as_array().unwrap();
        assert_eq!(points.len(), DAYS, "{path}");
        let first = points[0]["value"].as_f64().unwrap();
        assert!((first / level - 1.0).abs() < 0.02, "{path}: {first}");
        let found = chart["change_points"].as_array().unwrap();
        assert_eq!(found.len(), changes, "{path}: {chart:#}");
        if changes == 1 {
            assert_eq!(found[0]["pair"], "0-1");
        }
    }
}

/// The verdicts are the worst pair's as before, and pass: the slowed pairs are still
/// faster than it. Each carries its per-pair figures besides.
async fn verdicts_judge_the_worst_pair(p: &Pairs, last_runs: &[uuid::Uuid]) {
    let Pairs {
        server,
        http,
        admin,
        ..
    } = p;
    let (s, results) = call(
        http,
        server,
        Method::GET,
        &format!("/api/v1/runs/{}/results", last_runs[0]),
        admin,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{results}");
    let verdict = &results[0]["verdict"];
    assert_eq!(verdict["verdict"], "pass", "{verdict:#}");
    assert_eq!(verdict["test"], "p2p");
    assert_eq!(verdict["metric"], "algbw_gbs");
    assert!(
        (verdict["value"].as_f64().unwrap() - 300.0).abs() < 5.0,
        "{verdict:#}"
    );
    let figures = verdict["figures"].as_array().unwrap();
    let judged: Vec<&Value> = figures.iter().filter(|f| f.get("pair").is_none()).collect();
    let pairs: Vec<&str> = figures.iter().filter_map(|f| f["pair"].as_str()).collect();
    assert_eq!(judged.len(), 3, "{figures:#?}");
    assert_eq!(pairs.len(), GPUS * GPUS + 2 * GPUS, "{figures:#?}");
    let slowed = figures
        .iter()
        .find(|f| f["test"] == "p2p.d2d" && f["pair"] == "0-1")
        .unwrap();
    assert!(
        (slowed["value"].as_f64().unwrap() - 333.0).abs() < 5.0,
        "{slowed}"
    );
}

/// Shown with its pair in the node's health, and counted in its test's gauge.
async fn health_and_metrics_name_the_pair(p: &Pairs) {
    let Pairs {
        server,
        http,
        admin,
        ..
    } = p;
    let (_, health) = call(
        http,
        server,
        Method::GET,
        "/api/v1/nodes/p1/health",
        admin,
        None,
    )
    .await;
    let reasons = health["reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{health:#}");
    assert_eq!(reasons[0]["code"], "regression");
    assert_eq!(reasons[0]["metric"], "p2p.d2d/algbw_gbs");
    assert!(
        reasons[0]["message"]
            .as_str()
            .unwrap()
            .contains("(pair 0-1, band 2^28"),
        "{health:#}"
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
        metrics.contains("heddle_regressions_open{Hostname=\"p1\",test=\"p2p.d2d\"} 1"),
        "{metrics}"
    );
}
