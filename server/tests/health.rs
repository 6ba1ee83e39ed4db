//! Verdicts on uploaded results, expectations from operators and plugins, node and fleet
//! health, pre-flight and the health metrics, against a real Postgres.

mod common;
#[path = "health/expectations.rs"]
mod expectations;
#[path = "health/preflight.rs"]
mod preflight;

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const GIB: i64 = 1 << 30;

/// Enrolls a node with `gpus` GPUs of `model` in its facts.
async fn gpu_node(
    api: &Api,
    server: &TestServer,
    host: &str,
    model: &str,
    gpus: usize,
) -> FakeAgent {
    let a = enroll(api, server, host).await;
    let facts = json!({"host": {"hostname": host}, "gpus": (0..gpus).map(|i| json!({"index": i, "name": model})).collect::<Vec<_>>()});
    let (s, body) = api
        .call(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&a.credential),
            Some(facts),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    a
}

/// What NCCL's log says on one node whose GPUs talk over NVLink (no HCA in the facts).
static NVLINK_EVIDENCE: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    json!({"network": "Socket", "channel_lines": 48, "transports": {"P2P": 48},
           "channel_transports": ["P2P/CUMEM/read"]})
});

/// nccl-tests rows for a 2-GPU all_reduce: a small size and 8 GiB in both modes.
fn nccl_upload(key: &str, busbw: f64, wrong: i64) -> Value {
    json!({
        "upload_key": key, "outcome": "succeeded", "summary": {"nranks": 2, "nccl_evidence": NVLINK_EVIDENCE.clone()},
        "rows": [
            {"size_bytes": 1048576, "op": "all_reduce", "busbw_gbs": 74.0, "algbw_gbs": 74.0, "time_us": 14.0, "wrong": 0, "in_place": false},
            {"size_bytes": 8 * GIB, "op": "all_reduce", "busbw_gbs": busbw, "algbw_gbs": busbw, "time_us": 24795.0, "wrong": wrong, "in_place": false},
            {"size_bytes": 8 * GIB, "op": "all_reduce", "busbw_gbs": busbw, "algbw_gbs": busbw, "time_us": 24795.0, "wrong": 0, "in_place": true}
        ],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    })
}

fn memcpy_upload(key: &str, gbs: f64) -> Value {
    json!({
        "upload_key": key, "outcome": "succeeded", "summary": {},
        "rows": [{"size_bytes": 64 << 20, "op": "memcpy", "algbw_gbs": gbs, "time_us": 100.0, "wrong": 0}],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    })
}

/// Starts a one-node run, lets the node's agent claim it and upload `body`; returns the
/// stored result with its verdict, as `GET /runs/{id}/results` shows it.
async fn run_once(
    api: &Api,
    server: &TestServer,
    agent: &FakeAgent,
    host: &str,
    kind: &str,
    params: Value,
    body: Value,
) -> Value {
    let run = server
        .start_run(json!({"kind": kind, "params": params, "nodes": [host]}))
        .await;
    let lease = agent.claim(api).await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, up) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &agent.credential,
            body,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{up}");
    let (s, results) = api
        .get(
            &format!("/api/v1/runs/{}/results", run.id),
            &server.admin_token,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    results[0].clone()
}

fn bases(result: &Value) -> Vec<String> {
    result["verdict"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["basis"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_degraded_node_fails_a_slower_one_warns_and_the_others_pass() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let agents = five_nodes_with_a_healthy_history(&api, &server).await;
    h4_fails_h5_warns_and_the_others_pass(&api, &server, &agents).await;
    node_and_fleet_health_worst_first(&api, &admin).await;
    metrics_carry_the_latest_verdicts(&api).await;
    wrong_elements_or_a_failed_test_fail(&api, &server, &agents).await;
    every_result_is_judged_once(&server).await;
}

const HOSTS: [&str; 5] = ["h1", "h2", "h3", "h4", "h5"];

/// Five nodes of 2× H200, each with three healthy all_reduce results.
async fn five_nodes_with_a_healthy_history(api: &Api, server: &TestServer) -> Vec<FakeAgent> {
    let hosts = HOSTS;
    let mut agents = Vec::new();
    for h in hosts {
        agents.push(gpu_node(api, server, h, "NVIDIA H200", 2).await);
    }
    // History: three healthy all_reduce results per node.
    for round in 0..3 {
        for (i, h) in hosts.iter().enumerate() {
            let r = run_once(
                api,
                server,
                &agents[i],
                h,
                "nccl",
                json!({"op": "all_reduce"}),
                nccl_upload(&format!("{h}-{round}"), 340.0 + i as f64, 0),
            )
            .await;
            assert_eq!(r["verdict"]["verdict"], "pass", "{r}");
            assert_eq!(r["verdict"]["test"], "nccl.all_reduce");
        }
    }
    agents
}

/// The last results: h4 well below every expectation fails, h5 below its own baseline
/// warns, the others pass.
async fn h4_fails_h5_warns_and_the_others_pass(
    api: &Api,
    server: &TestServer,
    agents: &[FakeAgent],
) {
    let hosts = HOSTS;
    let mut last = Vec::new();
    for (i, (h, bw)) in hosts
        .iter()
        .zip([342.0, 343.0, 341.0, 250.0, 318.0])
        .enumerate()
    {
        last.push(
            run_once(
                api,
                server,
                &agents[i],
                h,
                "nccl",
                json!({"op": "all_reduce"}),
                nccl_upload(&format!("{h}-last"), bw, 0),
            )
            .await,
        );
    }
    for r in &last[..3] {
        assert_eq!(r["verdict"]["verdict"], "pass", "{r}");
        assert!(
            r["verdict"]["reasons"].as_array().unwrap().is_empty(),
            "{r}"
        );
        assert_eq!(r["verdict"]["metric"], "busbw_gbs");
    }
    // h4: below the built-in floor for 2× H200 (80 % of the 326 GB/s Heddle measured),
    // below its own baseline and an outlier in the fleet.
    let h4 = &last[3];
    assert_eq!(h4["verdict"]["verdict"], "fail", "{h4}");
    let b = bases(h4);
    assert!(
        b[0].starts_with("expectation:measured by Heddle on 2x H200"),
        "{b:?}"
    );
    assert!(
        b.contains(&"node-baseline".to_string()) && b.contains(&"fleet-median".to_string()),
        "{b:?}"
    );
    assert_eq!(h4["verdict"]["reasons"][0]["expected"], 260.0);
    assert_eq!(h4["verdict"]["reasons"][0]["observed"], 250.0);
    assert_eq!(h4["verdict"]["reasons"][0]["severity"], "fail");
    // h5: 318 against a baseline of 344: 7.6 % down, above the floor, within 10 % of the fleet.
    let h5 = &last[4];
    assert_eq!(h5["verdict"]["verdict"], "warn", "{h5}");
    assert_eq!(bases(h5), vec!["node-baseline"]);
    assert_eq!(h5["verdict"]["reasons"][0]["expected"], 344.0);
}

/// Node and fleet health, the worst node first and a page at a time.
async fn node_and_fleet_health_worst_first(api: &Api, admin: &str) {
    // Node and fleet health.
    let (s, n) = api.get("/api/v1/nodes/h4/health", admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (
            n["verdict"].as_str(),
            n["tests"][0]["test"].as_str(),
            n["tests"][0]["value"].as_f64()
        ),
        (Some("fail"), Some("nccl.all_reduce"), Some(250.0))
    );
    let (_, f) = api.get("/api/v1/health", admin).await;
    assert_eq!(
        (
            f["pass"].as_i64(),
            f["warn"].as_i64(),
            f["fail"].as_i64(),
            f["unknown"].as_i64()
        ),
        (Some(3), Some(1), Some(1), Some(0)),
        "{f}"
    );
    assert_eq!(f["nodes"][0]["hostname"], "h4", "worst first");
    assert_eq!(f["nodes"][0]["failing"][0], "nccl.all_reduce");
    // A page at a time, in the same order, with the whole fleet's counts on every page.
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let path = match &cursor {
            None => "/api/v1/health?limit=2".to_string(),
            Some(c) => format!("/api/v1/health?limit=2&cursor={c}"),
        };
        let resp = api
            .http
            .get(format!("{}{path}", api.base))
            .bearer_auth(admin)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        cursor = resp
            .headers()
            .get(heddle_types::NEXT_CURSOR_HEADER)
            .map(|v| v.to_str().unwrap().to_string());
        let page: Value = resp.json().await.unwrap();
        assert_eq!(page["pass"], 3, "{page}");
        assert!(page["nodes"].as_array().unwrap().len() <= 2, "{page}");
        paged.extend(
            page["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["hostname"].clone()),
        );
        if cursor.is_none() {
            break;
        }
    }
    let whole: Vec<Value> = f["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["hostname"].clone())
        .collect();
    assert_eq!(paged, whole);
    for bad in ["cursor=!!", "cursor=YzE6eA", "limit=two", "page=2"] {
        let (s, body) = api.get(&format!("/api/v1/health?{bad}"), admin).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    assert_eq!(
        api.get("/api/v1/nodes/nope/health", admin).await.0,
        StatusCode::NOT_FOUND
    );
}

/// Metrics: the latest verdict and figure per node and test.
async fn metrics_carry_the_latest_verdicts(api: &Api) {
    let (s, text) = api.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(
        text.contains(r#"heddle_health_verdict{Hostname="h4",test="nccl.all_reduce"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"heddle_health_verdict{Hostname="h5",test="nccl.all_reduce"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"heddle_health_verdict{Hostname="h1",test="nccl.all_reduce"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"heddle_result_bandwidth_bytes_per_second{Hostname="h4",test="nccl.all_reduce",figure="busbw"} 250000000000"#
        ),
        "{text}"
    );
    assert_eq!(
        text.matches("heddle_health_verdict{").count(),
        5,
        "one series per node and test: {text}"
    );
}

/// Wrong elements fail whatever the bandwidth; a failed test fails.
async fn wrong_elements_or_a_failed_test_fail(
    api: &Api,
    server: &TestServer,
    agents: &[FakeAgent],
) {
    let r = run_once(
        api,
        server,
        &agents[0],
        "h1",
        "nccl",
        json!({}),
        nccl_upload("h1-wrong", 345.0, 3),
    )
    .await;
    assert_eq!(
        (r["verdict"]["verdict"].as_str(), bases(&r)[0].as_str()),
        (Some("fail"), "validation")
    );
    let failed = json!({"upload_key": "h2-failed", "outcome": "failed", "reason": "ncclCommInitRank: unhandled system error",
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"});
    let r = run_once(api, server, &agents[1], "h2", "nccl", json!({}), failed).await;
    assert_eq!(r["verdict"]["verdict"], "fail");
    assert!(
        r["verdict"]["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("unhandled system error")
    );
}

/// Every result judged exactly once, retries included, and judging again gives the same.
async fn every_result_is_judged_once(server: &TestServer) {
    let (results,): (i64,) = sqlx::query_as("SELECT count(*) FROM results")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    let (verdicts,): (i64,) = sqlx::query_as("SELECT count(*) FROM verdicts")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(results, verdicts);
    let (id,): (uuid::Uuid,) =
        sqlx::query_as("SELECT id FROM results WHERE upload_key = 'h4-last'")
            .fetch_one(&server.state.db)
            .await
            .unwrap();
    let again = heddle_server::health::verdict::judge_result(&server.state.db, id)
        .await
        .unwrap();
    assert_eq!(
        again.verdict.as_str(),
        "fail",
        "judging again gives the same verdict"
    );
    assert_eq!(again.reasons.len(), 3);
}

#[tokio::test]
async fn a_result_left_without_a_verdict_is_judged_later() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = gpu_node(&api, &server, "late-1", "NVIDIA H200", 2).await;
    let r = run_once(
        &api,
        &server,
        &agent,
        "late-1",
        "nccl",
        json!({"op": "all_reduce"}),
        nccl_upload("late-1-0", 100.0, 0),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
    // As if judging had failed when the result arrived: no verdict, and the upload was acknowledged.
    let id: uuid::Uuid = r["id"].as_str().unwrap().parse().unwrap();
    sqlx::query("DELETE FROM verdicts WHERE result_id = $1")
        .bind(id)
        .execute(&server.state.db)
        .await
        .unwrap();
    sqlx::query("UPDATE results SET received_at = now() - interval '1 minute' WHERE id = $1")
        .bind(id)
        .execute(&server.state.db)
        .await
        .unwrap();
    // Every replica's background loop catches up within a tick or two.
    let mut verdict = None;
    for _ in 0..50 {
        verdict =
            sqlx::query_as::<_, (String,)>("SELECT verdict FROM verdicts WHERE result_id = $1")
                .bind(id)
                .fetch_optional(&server.state.db)
                .await
                .unwrap();
        if verdict.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(verdict.map(|v| v.0).as_deref(), Some("fail"));
    assert_eq!(
        heddle_server::health::verdict::judge_pending(&server.state.db)
            .await
            .unwrap(),
        0,
        "nothing left"
    );
}

/// `allreduce` is an alias the agent accepts; the run must still be judged as the
/// all-reduce that built-in figures and history are keyed by.
#[tokio::test]
async fn a_run_started_with_a_collective_alias_is_judged_under_its_canonical_name() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = gpu_node(&api, &server, "alias-1", "NVIDIA H200", 2).await;
    let r = run_once(
        &api,
        &server,
        &agent,
        "alias-1",
        "nccl",
        json!({"op": "allreduce"}),
        nccl_upload("alias-1-a", 100.0, 0),
    )
    .await;
    assert_eq!(r["verdict"]["test"], "nccl.all_reduce", "{r}");
    // 100 GB/s on two H200s is far under the datasheet figure for nccl.all_reduce: judged
    // against it, not passed for want of an expectation.
    assert_eq!(r["verdict"]["verdict"], "fail", "{r}");
}
