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
        let lease = a.claim(&api).await;
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
    let (_, lease) = stays.try_claim(&api).await;
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

fn hosts(rows: &Value) -> Vec<String> {
    field(rows.as_array().unwrap(), "hostname")
}

/// The fleet page's filters: free text, `problems`, `link_layer=none`, and the counts that
/// say how many match. `problems=true` agrees row by row with `NodeSummary::problems`, the
/// rule the dashboard shows, so the SQL and the Rust cannot drift apart.
#[tokio::test]
async fn node_filters_and_counts_agree() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    // 40 nodes: every 10th offline, every 7th with a port DOWN, every 13th without facts,
    // every 4th without RDMA; f-017 has a bonded HCA and a trait.
    sqlx::query(
        "INSERT INTO nodes (id, hostname, facts, facts_updated_at, gpu_model, gpu_count, hcas,
                            port_states, link_layers, traits, last_seen_at)
         SELECT gen_random_uuid(), format('f-%s', lpad(i::text, 3, '0')),
           CASE WHEN i % 13 = 5 THEN NULL ELSE '{}'::jsonb END,
           CASE WHEN i % 13 = 5 THEN NULL ELSE now() END,
           'NVIDIA H100', 8,
           CASE WHEN i = 17 THEN ARRAY['mlx5_bond_0'] WHEN i % 4 = 3 THEN '{}' ELSE ARRAY['mlx5_0', 'mlx5_1'] END,
           CASE WHEN i % 4 = 3 THEN '{}' WHEN i % 7 = 2 THEN ARRAY['ACTIVE', 'DOWN'] ELSE ARRAY['ACTIVE', 'ACTIVE'] END,
           CASE WHEN i % 4 = 3 THEN '{}' ELSE ARRAY['InfiniBand', 'InfiniBand'] END,
           CASE WHEN i = 17 THEN '{\"cloud\": \"azure\"}'::jsonb ELSE '{}'::jsonb END,
           CASE WHEN i % 10 = 1 THEN now() - interval '1 hour' ELSE now() END
         FROM generate_series(0, 39) i",
    )
    .execute(&server.state.db)
    .await
    .unwrap();

    let (s, all) = api.get("/api/v1/nodes", &admin).await;
    assert_eq!(s, StatusCode::OK);
    let all: Vec<heddle_types::nodes::NodeSummary> = serde_json::from_value(all).unwrap();
    let broken: Vec<String> = all
        .iter()
        .filter(|n| !n.problems().is_empty())
        .map(|n| n.hostname.clone())
        .collect();
    let healthy: Vec<String> = all
        .iter()
        .filter(|n| n.problems().is_empty())
        .map(|n| n.hostname.clone())
        .collect();
    assert!(broken.len() > 5 && healthy.len() > 5, "{broken:?}");
    let (_, p) = api.get("/api/v1/nodes?problems=true", &admin).await;
    assert_eq!(hosts(&p), broken);
    let (_, p) = api.get("/api/v1/nodes?problems=false", &admin).await;
    assert_eq!(hosts(&p), healthy);
    // Problems page like everything else, the filter kept across pages.
    let (paged, _) = pages(&api, &admin, "/api/v1/nodes?problems=true&limit=4").await;
    let paged: Vec<String> = paged.iter().flat_map(|p| field(p, "hostname")).collect();
    assert_eq!(paged, broken);

    // Counts: of the whole fleet, and of what the same filters match.
    let (s, c) = api.get("/api/v1/nodes/counts", &admin).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        c,
        json!({"fleet": 40, "total": 40, "online": 36, "stale": 0, "offline": 4,
               "problems": broken.len()})
    );
    let (_, c) = api
        .get("/api/v1/nodes/counts?problems=true&liveness=online", &admin)
        .await;
    // The filter's first name, health, is still read, and means the same.
    let (_, by_first_name) = api
        .get("/api/v1/nodes/counts?problems=true&health=online", &admin)
        .await;
    assert_eq!(by_first_name, c);
    let online_broken = all
        .iter()
        .filter(|n| n.liveness == heddle_types::nodes::Liveness::Online && !n.problems().is_empty())
        .count();
    assert_eq!(
        (&c["fleet"], &c["total"], &c["problems"], &c["offline"]),
        (
            &json!(40),
            &json!(online_broken),
            &json!(online_broken),
            &json!(0)
        )
    );

    // Free text: hostname, HCA, trait, case-insensitive; wildcards are plain characters.
    for (q, want) in [
        (
            "F-01",
            (10..20).map(|i| format!("f-{i:03}")).collect::<Vec<_>>(),
        ),
        ("mlx5_bond", vec!["f-017".to_string()]),
        ("cloud%3Dazure", vec!["f-017".to_string()]),
        ("%25", vec![]),
        ("f_0", vec![]),
    ] {
        let (s, rows) = api.get(&format!("/api/v1/nodes?q={q}"), &admin).await;
        assert_eq!(s, StatusCode::OK, "{q}: {rows}");
        assert_eq!(hosts(&rows), want, "q={q}");
    }
    let (_, c) = api.get("/api/v1/nodes/counts?q=F-01", &admin).await;
    assert_eq!(c["total"], 10);
    // No RDMA at all.
    let (_, rows) = api.get("/api/v1/nodes?link_layer=none", &admin).await;
    let want: Vec<String> = (0..40)
        .filter(|i| i % 4 == 3)
        .map(|i| format!("f-{i:03}"))
        .collect();
    assert_eq!(hosts(&rows), want);

    // Hostile values are refused with words that say what is wrong, by both routes.
    let long = "a".repeat(201);
    for (query, says) in [
        ("liveness=broken", "must be online, stale or offline"),
        ("health=broken", "must be online, stale or offline"),
        ("liveness=online&health=stale", "disagree"),
        ("problems=maybe", "problems"),
        ("q=a%0Ab", "control character"),
        (&format!("q={long}") as &str, "at most 200 characters"),
        ("colour=red", "colour"),
    ] {
        for route in ["/api/v1/nodes", "/api/v1/nodes/counts"] {
            let (s, body) = api.get(&format!("{route}?{query}"), &admin).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{route}?{query}: {body}");
            assert_eq!(error_code(&body), "bad_request");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains(says), "{route}?{query}: {message}");
        }
    }
}
