//! The fabric page: a generated fat tree imported as the site's fabric, a fabric
//! investigation run over its sixteen nodes by simulated agents answering from the fabric
//! model with a hung leaf, and the page drawing the fabric with that leaf marked; the
//! investigation's page names it in the fabric's terms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use heddle_e2e::fabric_oracle::{Oracle, result_body};
use heddle_server::testing::TestServer;
use heddle_types::fabric::generate::{FatTree, fat_tree};
use heddle_types::fabric::index::Index;
use serde_json::{Value, json};

use super::browser::wait_text;
use super::{Api, Shots, enroll};

/// One simulated agent: heartbeats, claims, and answers each test from the model.
async fn agent(base: String, credential: String, oracle: Arc<Oracle>) {
    let http = reqwest::Client::new();
    loop {
        let _ = http
            .post(format!("{base}/api/v1/agent/heartbeat"))
            .bearer_auth(&credential)
            .json(&json!({"agent_version": "0.1.0", "running_jobs": []}))
            .send()
            .await;
        let r = http
            .post(format!("{base}/api/v1/agent/jobs/claim"))
            .bearer_auth(&credential)
            .send()
            .await;
        let lease: Option<Value> = match r {
            Ok(r) if r.status() == 200 => r.json().await.ok(),
            _ => None,
        };
        let Some(lease) = lease else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let run = lease["run_id"].as_str().unwrap().parse().unwrap();
        let body = result_body(&lease, &oracle.answer(run).await);
        let job = lease["job_id"].as_str().unwrap();
        let _ = http
            .post(format!("{base}/api/v1/agent/jobs/{job}/result"))
            .bearer_auth(&credential)
            .json(&body)
            .send()
            .await;
    }
}

pub async fn fabric_page(c: &Client, server: &TestServer, api: &Api, shots: &Shots) {
    let admin = &server.admin_token;
    let fabric = fat_tree(&FatTree {
        nodes: 16,
        rails: 2,
        nodes_per_leaf: 4,
        spines_per_rail: 1,
    });
    api.ok(
        reqwest::Method::PUT,
        "/api/v1/fabric",
        Some(admin),
        Some(json!({"source": "heddle", "text": serde_json::to_string(&fabric).unwrap()})),
    )
    .await;
    let ix: &'static Index = Box::leak(Box::new(Index::new(&fabric)));
    let faults = ["leaf:leaf-su1-r0:hang".parse().unwrap()];
    let oracle = Arc::new(Oracle::new(ix, &faults, 7, &server.url, admin).unwrap());
    let mut agents = Vec::new();
    for n in &fabric.nodes {
        let credential = enroll(api, server, &n.name, None).await;
        agents.push(tokio::spawn(agent(
            server.url.clone(),
            credential,
            oracle.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let inv = api
        .ok(
            reqwest::Method::POST,
            "/api/v1/fabric/investigations",
            Some(admin),
            Some(json!({"suspects": ["n[0001-0016]"], "label": "rack 1 is slow"})),
        )
        .await;
    let id = inv["id"].as_str().unwrap().to_string();
    let path = format!("/api/v1/fabric/investigations/{id}");
    let start = Instant::now();
    let done = loop {
        let inv = api.ok(reqwest::Method::GET, &path, Some(admin), None).await;
        if inv["state"] != "running" {
            break inv;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "still running: {inv:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for a in agents {
        a.abort();
    }
    assert_eq!(done["blamed"][0]["id"], "leaf-su1-r0", "{done:#}");

    c.goto(&format!("{}/fabric", server.url)).await.unwrap();
    wait_text(c, "#fabric-investigations", "leaf-su1-r0").await;
    let blamed = wait_text(c, "#fabric-drawing .sw.blamed", "leaf-su1-r0").await;
    assert!(blamed.contains("blamed"), "{blamed}");
    let boxes = c
        .find_all(Locator::Css("#fabric-drawing .sw"))
        .await
        .unwrap()
        .len();
    assert_eq!(boxes, 8 + 2, "8 leaves and 2 spines, each a box");
    let marked = c
        .find_all(Locator::Css("#fabric-drawing .sw.blamed"))
        .await
        .unwrap()
        .len();
    assert_eq!(marked, 1, "only the blamed leaf is marked");
    shots.take(c, "14-fabric").await;

    c.goto(&format!("{}/fabric/investigations/{id}", server.url))
        .await
        .unwrap();
    wait_text(c, "#fabric-investigation-state", "done").await;
    wait_text(c, "#fabric-blamed", "leaf switch leaf-su1-r0").await;
    wait_text(c, "#fabric-blamed", "n[0005-0008]").await;
    wait_text(c, "#fabric-tests", "hung").await;
    shots.take(c, "15-fabric-investigation").await;
}
