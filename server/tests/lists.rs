//! Lists that scale: keyset pages of nodes, runs and results (`limit`, `cursor`, the
//! `x-next-cursor` header), and a facts history kept to its configured length.

mod common;

use common::*;
use heddle_server::testing::TestServer;
use heddle_types::NEXT_CURSOR_HEADER;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Every page of `path` (which has a query already), `limit` at a time: the rows of each
/// page and how many pages there were.
async fn pages(api: &Api, token: &str, path: &str) -> (Vec<Vec<Value>>, usize) {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            None => format!("{}{path}", api.base),
            Some(c) => format!("{}{path}&cursor={c}", api.base),
        };
        let resp = api.http.get(url).bearer_auth(token).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let next = resp
            .headers()
            .get(NEXT_CURSOR_HEADER)
            .map(|v| v.to_str().unwrap().to_string());
        let rows: Vec<Value> = resp.json().await.unwrap();
        out.push(rows);
        assert!(out.len() < 50, "cursors never end");
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let n = out.len();
    (out, n)
}

fn field(rows: &[Value], key: &str) -> Vec<String> {
    rows.iter()
        .map(|r| r[key].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn nodes_runs_and_results_come_in_pages() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let mut agents = Vec::new();
    for i in [4, 0, 6, 2, 5, 1, 3] {
        agents.push((i, enroll(&api, &server, &format!("page-{i}")).await));
    }
    enroll(&api, &server, "other-0").await;

    // Nodes: by hostname, 3 at a time, filters kept across pages.
    let (pages_of_nodes, n) = pages(&api, &admin, "/api/v1/nodes?hostname=page-&limit=3").await;
    assert_eq!(n, 3);
    assert_eq!(
        pages_of_nodes.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![3, 3, 1]
    );
    let names: Vec<String> = pages_of_nodes
        .iter()
        .flat_map(|p| field(p, "hostname"))
        .collect();
    let want: Vec<String> = (0..7).map(|i| format!("page-{i}")).collect();
    assert_eq!(names, want);
    // A page that is not full has no cursor; without `limit` one page holds them all.
    let (all, n) = pages(&api, &admin, "/api/v1/nodes?hostname=page-").await;
    assert_eq!((n, all[0].len()), (1, 7));
    // A cursor this server did not hand out is refused.
    let (s, body) = api
        .get("/api/v1/nodes?cursor=bm90LWEtY3Vyc29y", &admin)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(error_code(&body), "bad_request");

    // Runs: newest first, 2 at a time, none repeated or skipped.
    let mut started = Vec::new();
    for _ in 0..5 {
        started.push(
            server
                .start_run(
                    json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["other-0"]}),
                )
                .await
                .id
                .to_string(),
        );
    }
    started.reverse();
    let (pages_of_runs, n) = pages(&api, &admin, "/api/v1/runs?limit=2").await;
    assert_eq!(n, 3);
    let ids: Vec<String> = pages_of_runs.iter().flat_map(|p| field(p, "id")).collect();
    assert_eq!(ids, started);

    // Results of a run on the seven nodes: by rank, 3 at a time.
    let run = server
        .start_run(json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": want}))
        .await;
    for (i, a) in &agents {
        let (s, lease) = api
            .call(
                Method::POST,
                "/api/v1/agent/jobs/claim",
                Some(&a.credential),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{lease}");
        let job = lease["job_id"].as_str().unwrap();
        let (s, body) = api
            .post(
                &format!("/api/v1/agent/jobs/{job}/result"),
                &a.credential,
                result_body(&format!("page-result-{i}"), "succeeded"),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
    }
    let path = format!("/api/v1/runs/{}/results?limit=3", run.id);
    let (pages_of_results, n) = pages(&api, &admin, &path).await;
    assert_eq!(n, 3);
    let hosts: Vec<String> = pages_of_results
        .iter()
        .flat_map(|p| field(p, "hostname"))
        .collect();
    assert_eq!(
        hosts, want,
        "rank order is the order the run named the nodes"
    );
    assert_eq!(pages_of_results[0][0]["rows"].as_array().unwrap().len(), 2);
    let (one, _) = pages(&api, &admin, &format!("/api/v1/runs/{}/results?", run.id)).await;
    assert_eq!(one[0].len(), 7, "one page holds up to 1000 results");
}

#[tokio::test]
async fn facts_history_keeps_the_configured_number_of_changes() {
    let server = TestServer::start_with(|c| c.facts_history_keep = 3).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let a = enroll(&api, &server, "history-1").await;
    for kernel in 0..6 {
        let (s, body) = api
            .call(
                Method::PUT,
                "/api/v1/agent/facts",
                Some(&a.credential),
                Some(json!({"host": {"hostname": "history-1", "kernel": format!("6.{kernel}")}})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(body["changed"], true);
    }
    let (s, history) = api
        .get("/api/v1/nodes/history-1/facts/history?limit=100", &admin)
        .await;
    assert_eq!(s, StatusCode::OK);
    let kernels: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["facts"]["host"]["kernel"].as_str().unwrap())
        .collect();
    assert_eq!(
        kernels,
        vec!["6.5", "6.4", "6.3"],
        "the newest three, newest first"
    );
    let (stored,): (i64,) = sqlx::query_as("SELECT count(*) FROM node_facts_history")
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(stored, 3);
}

#[tokio::test]
async fn a_decommissioned_node_is_deleted_with_what_is_only_about_it() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let gone = enroll(&api, &server, "decom-1").await;
    let stays = enroll(&api, &server, "decom-2").await;
    let run = server
        .start_run(
            json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["decom-1", "decom-2"]}),
        )
        .await;

    let operator = server.token(heddle_types::auth::Role::Operator).await;
    let (s, _) = api
        .call(
            Method::DELETE,
            "/api/v1/nodes/decom-1",
            Some(&operator),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "admins only");
    let (s, body) = api
        .call(Method::DELETE, "/api/v1/nodes/decom-1", Some(&admin), None)
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert!(body["message"].as_str().unwrap().contains("runs cancel"));

    // The other node's job finishes; the run is cancelled, which ends decom-1's job.
    let (_, lease) = api
        .call(
            Method::POST,
            "/api/v1/agent/jobs/claim",
            Some(&stays.credential),
            None,
        )
        .await;
    let job = lease["job_id"].as_str().unwrap();
    let (s, _) = api
        .post(
            &format!("/api/v1/agent/jobs/{job}/result"),
            &stays.credential,
            result_body("decom-kept", "succeeded"),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = api
        .call(
            Method::POST,
            &format!("/api/v1/runs/{}/cancel", run.id),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    let (s, body) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/nodes/{}", gone.node_id),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(
        api.get("/api/v1/nodes/decom-1", &admin).await.0,
        StatusCode::NOT_FOUND
    );
    let (s, _) = api
        .post("/api/v1/agent/heartbeat", &gone.credential, json!({}))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "its credential is dead");
    // The run keeps the other node's job and result.
    let after = server.get_run(run.id).await;
    assert_eq!(after.jobs.len(), 1);
    assert_eq!(after.jobs[0].hostname, "decom-2");
    let (_, results) = api
        .get(&format!("/api/v1/runs/{}/results", run.id), &admin)
        .await;
    assert_eq!(
        field(results.as_array().unwrap(), "hostname"),
        vec!["decom-2"]
    );
    let (audited,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM audit_log WHERE action = 'node.delete' AND target = 'node:decom-1'",
    )
    .fetch_one(&server.state.db)
    .await
    .unwrap();
    assert_eq!(audited, 1);
    // Deleting it again finds nothing.
    let (s, _) = api
        .call(Method::DELETE, "/api/v1/nodes/decom-1", Some(&admin), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}
