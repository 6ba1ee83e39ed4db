//! `heddle investigate fabric` against a real server: sixteen agents driven over the agent
//! protocol answer every test from the fabric model with a slow leaf; the CLI starts the
//! investigation, `show` names the leaf in the fabric's terms with the nodes behind it,
//! `--watch` exits 1 because something was blamed, and `ls --fabric` lists it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{claim, enroll, get, heddle, upload};
use heddle_e2e::fabric_oracle::{Oracle, result_body};
use heddle_server::testing::TestServer;
use heddle_types::fabric::generate::{FatTree, fat_tree};
use heddle_types::fabric::index::Index;
use serde_json::{Value, json};

/// Claims and answers every queued test of the agents until the investigation ends.
async fn serve_tests(server: &TestServer, agents: &[String], oracle: &Oracle, id: &str) -> Value {
    for _ in 0..600 {
        for cred in agents {
            let Some(lease) = claim(server, cred).await else {
                continue;
            };
            let run = lease["run_id"].as_str().unwrap().parse().unwrap();
            let body = result_body(&lease, &oracle.answer(run).await);
            upload(server, cred, &lease, &body).await;
        }
        let inv = get(server, &format!("/api/v1/fabric/investigations/{id}")).await;
        if inv["state"] != "running" {
            return inv;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fabric investigation {id} did not finish");
}

#[tokio::test(flavor = "multi_thread")]
async fn investigate_fabric_show_and_watch() {
    let server = TestServer::start().await;
    let fabric = fat_tree(&FatTree {
        nodes: 16,
        rails: 2,
        nodes_per_leaf: 4,
        spines_per_rail: 1,
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.json");
    std::fs::write(&file, serde_json::to_vec(&fabric).unwrap()).unwrap();

    // Before any fabric: the refusal says what to do.
    let (code, _, err) = heddle(&server, &["investigate", "fabric", "--suspects", "n0001"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("heddle fabric import"), "{err}");

    let (code, _, err) = heddle(
        &server,
        &["fabric", "import", "--file", file.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    let http = reqwest::Client::new();
    let mut agents = Vec::new();
    for n in &fabric.nodes {
        let cred = enroll(&server, &n.name).await;
        // Heard from: a node is tested only when its agent was.
        http.post(format!("{}/api/v1/agent/heartbeat", server.url))
            .bearer_auth(&cred)
            .json(&json!({"agent_version": "test", "running_jobs": []}))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
        agents.push(cred);
    }
    let (code, out, err) = heddle(
        &server,
        &[
            "investigate",
            "fabric",
            "--suspects",
            "n[0001-0016]",
            "--label",
            "rack 1",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("16 suspects, 16 nodes it may test"), "{err}");
    let id = out.trim().to_string();

    let ix: &'static Index = Box::leak(Box::new(Index::new(&fabric)));
    let faults = ["leaf:leaf-su2-r1".parse().unwrap()];
    let oracle = Arc::new(Oracle::new(ix, &faults, 7, &server.url, &server.admin_token).unwrap());
    let inv = serve_tests(&server, &agents, &oracle, &id).await;
    assert_eq!(inv["blamed"][0]["id"], "leaf-su2-r1", "{inv:#}");

    let (code, shown, err) = heddle(&server, &["investigate", "show", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(
        shown.contains("blamed: leaf leaf-su2-r1 (100% sure): leaf switch leaf-su2-r1"),
        "{shown}"
    );
    assert!(
        shown.contains("its traffic: 4 node(s): n[0009-0012]"),
        "{shown}"
    );
    assert!(shown.contains("of them failed"), "{shown}");
    let (code, json_out, _) = heddle(&server, &["--json", "investigate", "show", &id]);
    assert_eq!(code, 0);
    let inv: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(inv["blamed"][0]["nodes"], "n[0009-0012]");
    let (code, _, err) = heddle(&server, &["investigate", "show", &id, "--watch"]);
    assert_eq!(code, 1, "a blamed component exits 1: {err}");
    let (code, list, _) = heddle(&server, &["investigate", "ls", "--fabric"]);
    assert_eq!(code, 0);
    assert!(list.contains(&id) && list.contains("leaf-su2-r1"), "{list}");
    // A pairwise id that does not exist is still a 404 for both kinds.
    let (code, _, err) = heddle(
        &server,
        &[
            "investigate",
            "show",
            "00000000-0000-0000-0000-000000000000",
        ],
    );
    assert_eq!(code, 5, "{err}");
}
