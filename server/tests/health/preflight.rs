//! Pre-flight: a node answered from its history, or checked by a fresh run while the
//! caller waits; undecided when nobody answers in time, and checked once.

use super::*;

#[tokio::test]
async fn preflight_from_history_and_from_a_fresh_run() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let viewer = server.token(heddle_types::auth::Role::Viewer).await;
    let p1 = gpu_node(&api, &server, "p1", "NVIDIA H200", 2).await;
    let p2 = gpu_node(&api, &server, "p2", "NVIDIA H200", 2).await;
    let _p3 = gpu_node(&api, &server, "p3", "NVIDIA H200", 2).await;
    p1_passes_from_its_history(&api, &server, &p1, [&admin, &viewer]).await;
    a_viewer_starts_no_check(&api, &viewer).await;
    p2_is_checked_by_a_fresh_run(&server, &api, &admin, &p2).await;
    nobody_answering_is_undecided_and_checked_once(&server, &api, &admin).await;
}

/// Bad requests are refused; p1 passes from its history.
async fn p1_passes_from_its_history(
    api: &Api,
    server: &TestServer,
    p1: &FakeAgent,
    [admin, viewer]: [&str; 2],
) {
    let r = run_once(
        api,
        server,
        p1,
        "p1",
        "nccl",
        json!({"op": "all_reduce"}),
        nccl_upload("p1-0", 340.0, 0),
    )
    .await;
    assert_eq!(r["verdict"]["verdict"], "pass");

    for (body, status) in [
        (json!({"nodes": []}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({"nodes": ["p1"], "wait_s": 601}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["p1"], "max_age_s": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["p1", "p1"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            json!({"nodes": ["p1"], "check": "bogus"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"nodes": ["nope"]}), StatusCode::NOT_FOUND),
    ] {
        assert_eq!(
            api.post("/api/v1/preflight", admin, body.clone()).await.0,
            status,
            "{body}"
        );
    }
    let (s, a) = api
        .post(
            "/api/v1/preflight",
            viewer,
            json!({"nodes": ["p1"], "max_age_s": 3600}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!(
        (a["verdict"].as_str(), a["nodes"][0]["from"].as_str()),
        (Some("pass"), Some("history"))
    );
}

/// A viewer may not start checks: the stale node is undecided.
async fn a_viewer_starts_no_check(api: &Api, viewer: &str) {
    let (_, a) = api
        .post("/api/v1/preflight", viewer, json!({"nodes": ["p1", "p3"]}))
        .await;
    assert_eq!(
        (
            a["verdict"].as_str(),
            a["nodes"][1]["verdict"].as_str(),
            a["nodes"][1]["from"].as_str()
        ),
        (Some("unknown"), Some("unknown"), Some("none"))
    );
    assert!(
        a["nodes"][1]["reasons"][0]["message"]
            .as_str()
            .unwrap()
            .contains("operator"),
        "{a}"
    );
}

/// p2 has no history: a check run is started and an agent answers it while we wait; then
/// p2 answers from history.
async fn p2_is_checked_by_a_fresh_run(server: &TestServer, api: &Api, admin: &str, p2: &FakeAgent) {
    let ask = {
        let api = Api::new(server);
        let admin = admin.to_string();
        tokio::spawn(async move {
            api.post(
                "/api/v1/preflight",
                &admin,
                json!({"nodes": ["p1", "p2"], "wait_s": 30}),
            )
            .await
        })
    };
    let lease = loop {
        let (s, lease) = p2.try_claim(api).await;
        if s == StatusCode::OK {
            break lease;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(lease["spec"]["kind"], "nccl");
    assert_eq!(lease["spec"]["params"]["max_bytes"], GIB);
    let slow = json!({
        "upload_key": "p2-check", "outcome": "succeeded", "summary": {"nranks": 2, "nccl_evidence": NVLINK_EVIDENCE.clone()},
        "rows": [{"size_bytes": GIB, "op": "all_reduce", "busbw_gbs": 200.0, "wrong": 0}],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"
    });
    let (s, _) = api
        .post(
            &format!(
                "/api/v1/agent/jobs/{}/result",
                lease["job_id"].as_str().unwrap()
            ),
            &p2.credential,
            slow,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, a) = ask.await.unwrap();
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!(a["verdict"], "fail", "{a}");
    assert_eq!(
        (
            a["nodes"][0]["from"].as_str(),
            a["nodes"][0]["verdict"].as_str()
        ),
        (Some("history"), Some("pass"))
    );
    assert_eq!(
        (
            a["nodes"][1]["from"].as_str(),
            a["nodes"][1]["verdict"].as_str()
        ),
        (Some("fresh-run"), Some("fail"))
    );
    assert!(
        a["nodes"][1]["reasons"][0]["basis"]
            .as_str()
            .unwrap()
            .starts_with("expectation:"),
        "{a}"
    );
    // Now p2 answers from history.
    let (_, a) = api
        .post(
            "/api/v1/preflight",
            admin,
            json!({"nodes": ["p2"], "wait_s": 0}),
        )
        .await;
    assert_eq!(
        (a["verdict"].as_str(), a["nodes"][0]["from"].as_str()),
        (Some("fail"), Some("history"))
    );
}

/// Nobody answers p3's check in time: undecided, and the next pre-flight waits on the same
/// run.
async fn nobody_answering_is_undecided_and_checked_once(
    server: &TestServer,
    api: &Api,
    admin: &str,
) {
    let (_, a) = api
        .post(
            "/api/v1/preflight",
            admin,
            json!({"nodes": ["p3"], "wait_s": 1, "check": "memcpy"}),
        )
        .await;
    assert_eq!(
        (a["verdict"].as_str(), a["nodes"][0]["from"].as_str()),
        (Some("unknown"), Some("fresh-run")),
        "{a}"
    );
    let run = a["nodes"][0]["run_id"].clone();
    assert!(run.is_string());
    let (_, b) = api
        .post(
            "/api/v1/preflight",
            admin,
            json!({"nodes": ["p3"], "wait_s": 1, "check": "memcpy"}),
        )
        .await;
    assert_eq!(
        b["nodes"][0]["run_id"], run,
        "one check run per node, not one per caller"
    );
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE label = 'preflight'")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(n, 2);
}
