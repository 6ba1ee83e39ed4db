//! Investigations end to end: fake agents speak the agent protocol over HTTP (claim,
//! rendezvous, upload) and report low busbw for pairs with a degraded node or link; the
//! investigation, started by hand or by a fail verdict, must name it. Also: two replicas
//! advancing one investigation, failed pairs, request checks and the p2p matrix.

mod common;
#[path = "investigations/p2p.rs"]
mod p2p;
#[path = "investigations/requests.rs"]
mod requests;
#[path = "investigations/scheduling.rs"]
mod scheduling;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use common::*;
use heddle_server::testing::TestServer;
use heddle_types::investigations::{Conclusion, CulpritKind, Investigation, InvestigationState};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

const GOOD: f64 = 180.0;
const SLOW: f64 = 55.0;

/// What is wrong in the simulated fabric.
#[derive(Clone)]
enum Fault {
    Node(String),
    Link(String, String),
    /// This node's agent fails every job it gets.
    Failing(String),
}

impl Fault {
    fn busbw(&self, me: &str, peer: &str) -> f64 {
        match self {
            Fault::Node(n) if me == n || peer == n => SLOW,
            Fault::Link(a, b) if (me == a && peer == b) || (me == b && peer == a) => SLOW,
            // A little spread, as on a real fabric.
            _ => {
                GOOD * (1.0
                    + 0.01
                        * ((me.len()
                            + peer.len()
                            + me.bytes().chain(peer.bytes()).map(u32::from).sum::<u32>() as usize)
                            % 4) as f64)
            }
        }
    }
}

/// Fake agents, one task per node, until stopped.
/// The host of rank 1 of each two-rank run, for its rank 0.
static RANK1_HOSTS: std::sync::LazyLock<Mutex<HashMap<String, String>>> =
    std::sync::LazyLock::new(Default::default);

struct Fleet {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Claims per job id.
    claims: Arc<Mutex<HashMap<String, u32>>>,
}

impl Fleet {
    async fn start(servers: &[&TestServer], hosts: &[&str], fault: Fault) -> Fleet {
        let api = Api::new(servers[0]);
        let stop = Arc::new(AtomicBool::new(false));
        let claims: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let bases: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
        let mut tasks = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            let agent = enroll(&api, servers[0], host).await;
            let (stop, claims, bases, fault, host) = (
                stop.clone(),
                claims.clone(),
                bases.clone(),
                fault.clone(),
                host.to_string(),
            );
            tasks.push(tokio::spawn(async move {
                agent_loop(bases, agent.credential, host, fault, stop, claims, i).await
            }));
        }
        Fleet {
            stop,
            tasks,
            claims,
        }
    }

    async fn stop(self) -> HashMap<String, u32> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("a fake agent panicked");
        }
        self.claims.lock().unwrap().clone()
    }
}

async fn agent_loop(
    bases: Vec<String>,
    cred: String,
    host: String,
    fault: Fault,
    stop: Arc<AtomicBool>,
    claims: Arc<Mutex<HashMap<String, u32>>>,
    mut turn: usize,
) {
    let http = reqwest::Client::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    while !stop.load(Ordering::SeqCst) {
        let base = &bases[turn % bases.len()];
        turn += 1;
        let resp = http
            .post(format!("{base}/api/v1/agent/jobs/claim"))
            .bearer_auth(&cred)
            .send()
            .await
            .unwrap();
        if resp.status() == StatusCode::NO_CONTENT {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(resp.status(), StatusCode::OK);
        let lease: Value = resp.json().await.unwrap();
        let (job, run) = (
            lease["job_id"].as_str().unwrap().to_string(),
            lease["run_id"].as_str().unwrap().to_string(),
        );
        let (rank, world) = (
            lease["rank"].as_i64().unwrap(),
            lease["world_size"].as_i64().unwrap(),
        );
        *claims.lock().unwrap().entry(job.clone()).or_default() += 1;
        // Two ranks meet through the server's rendezvous as the nccl runner does: rank 0
        // publishes (only rank 0 may), rank 1 reads it. Rank 0 learns its peer from rank 1
        // in this process, since the server takes no blob from other ranks.
        let busbw = if world == 2 {
            let peer = if rank == 0 {
                let put = http
                    .put(format!("{base}/api/v1/agent/rendezvous/{run}/host-0"))
                    .bearer_auth(&cred)
                    .json(&json!({"blob_b64": b64.encode(&host)}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(put.status(), StatusCode::NO_CONTENT);
                let mut peer = None;
                for _ in 0..600 {
                    peer = RANK1_HOSTS.lock().unwrap().get(&run).cloned();
                    if peer.is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                peer.unwrap_or_else(|| panic!("{host}: rank 1 of run {run} never came"))
            } else {
                RANK1_HOSTS
                    .lock()
                    .unwrap()
                    .insert(run.clone(), host.clone());
                let got = http
                    .get(format!(
                        "{base}/api/v1/agent/rendezvous/{run}/host-0?timeout_ms=30000"
                    ))
                    .bearer_auth(&cred)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(
                    got.status(),
                    StatusCode::OK,
                    "{host}: the peer of run {run} never came"
                );
                let blob: Value = got.json().await.unwrap();
                String::from_utf8(b64.decode(blob["blob_b64"].as_str().unwrap()).unwrap()).unwrap()
            };
            fault.busbw(&host, &peer)
        } else {
            SLOW
        };
        let failing = matches!(&fault, Fault::Failing(h) if *h == host);
        let row = |size: i64, bw: f64, in_place: bool| {
            json!({"size_bytes": size, "op": "all_reduce", "dtype": "float", "in_place": in_place, "time_us": 100.0,
                   "algbw_gbs": bw / 1.5, "busbw_gbs": bw, "wrong": 0})
        };
        let body = json!({
            "upload_key": format!("up-{job}"),
            "outcome": if failing { "failed" } else { "succeeded" },
            "reason": if failing { Some("NCCL WARN NET/IB: peer unreachable") } else { None },
            "summary": {"nccl_version": "2.23.4", "nccl_evidence": {"network": "IB", "channel_lines": 8,
                        "transports": {"NET/IB": 8}, "channel_transports": ["NET/IB/0/GDRDMA"], "gdr": true}},
            "rows": if failing { vec![] } else {
                vec![row(1 << 20, busbw / 4.0, false), row(1 << 20, busbw / 4.0, true), row(1 << 28, busbw, false), row(1 << 28, busbw * 0.98, true)]
            },
            "started_at": "2026-01-01T00:00:00Z",
            "finished_at": "2026-01-01T00:00:01Z"
        });
        let other = &bases[turn % bases.len()];
        let up = http
            .post(format!("{other}/api/v1/agent/jobs/{job}/result"))
            .bearer_auth(&cred)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            up.status(),
            StatusCode::CREATED,
            "{}",
            up.text().await.unwrap()
        );
    }
}

async fn investigation(api: &Api, token: &str, id: Uuid) -> Investigation {
    let (s, body) = api
        .get(&format!("/api/v1/investigations/{id}"), token)
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

async fn wait_done(api: &Api, token: &str, id: Uuid) -> Investigation {
    for _ in 0..600 {
        let inv = investigation(api, token, id).await;
        if inv.state != InvestigationState::Running {
            return inv;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "investigation {id} did not finish in 60 s: {:?}",
        investigation(api, token, id).await.progress
    );
}

/// Every pair has one run of its own, every job was claimed once and succeeded first time,
/// and no batch put a node in two pairs or started before the previous batch ended.
async fn check_schedule(
    server: &TestServer,
    inv: &Investigation,
    claims: &HashMap<String, u32>,
    batch_size: usize,
) {
    let n = inv.nodes.len();
    assert_eq!(inv.pairs.len(), n * (n - 1) / 2);
    let runs: BTreeSet<Uuid> = inv
        .pairs
        .iter()
        .map(|p| p.run_id.expect("every pair ran"))
        .collect();
    assert_eq!(runs.len(), inv.pairs.len(), "one run per pair");
    assert_eq!(inv.runs.len(), inv.pairs.len());
    let (labelled,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE label LIKE $1")
        .bind(format!("investigation {}:%", inv.id))
        .fetch_one(&server.state.db)
        .await
        .unwrap();
    assert_eq!(
        labelled as usize,
        inv.pairs.len(),
        "no batch was started twice"
    );
    let jobs: Vec<(Uuid, Uuid, i32, String)> =
        sqlx::query_as("SELECT id, run_id, attempts, state FROM jobs WHERE run_id = ANY($1)")
            .bind(runs.iter().copied().collect::<Vec<_>>())
            .fetch_all(&server.state.db)
            .await
            .unwrap();
    assert_eq!(jobs.len(), 2 * inv.pairs.len());
    for (id, _, attempts, state) in &jobs {
        assert_eq!((*attempts, state.as_str()), (1, "succeeded"), "job {id}");
        assert_eq!(
            claims.get(&id.to_string()),
            Some(&1),
            "job {id} claimed exactly once"
        );
    }
    let batches = inv.pairs.iter().map(|p| p.batch).max().unwrap() + 1;
    for b in 0..batches {
        let pairs: Vec<_> = inv.pairs.iter().filter(|p| p.batch == b).collect();
        if batch_size > 0 {
            assert!(
                pairs.len() <= batch_size,
                "batch {b}: {} pairs",
                pairs.len()
            );
        }
        let mut busy = BTreeSet::new();
        for p in &pairs {
            assert!(
                busy.insert(&p.a) && busy.insert(&p.b),
                "batch {b} has a node twice"
            );
        }
        if b > 0 && batch_size > 0 {
            let ids = |b: i32| {
                inv.pairs
                    .iter()
                    .filter(|p| p.batch == b)
                    .filter_map(|p| p.run_id)
                    .collect::<Vec<_>>()
            };
            let (started, prev_done): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) = sqlx::query_as(
                "SELECT (SELECT min(created_at) FROM runs WHERE id = ANY($1)), (SELECT max(finished_at) FROM jobs WHERE run_id = ANY($2))",
            )
            .bind(ids(b))
            .bind(ids(b - 1))
            .fetch_one(&server.state.db)
            .await
            .unwrap();
            assert!(
                started >= prev_done,
                "batch {b} started before batch {} ended",
                b - 1
            );
        }
    }
}

fn named(inv: &Investigation) -> Vec<(CulpritKind, Vec<String>)> {
    inv.analysis
        .culprits
        .iter()
        .map(|c| (c.kind, c.members.clone()))
        .collect()
}

#[tokio::test]
async fn started_by_hand_it_names_the_degraded_node() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    let hosts = ["hand-a", "hand-b", "hand-c", "hand-d", "hand-e"];
    let fleet = Fleet::start(&[&server], &hosts, Fault::Node("hand-c".into())).await;
    let (s, body) = api
        .post("/api/v1/investigations", &token, json!({"nodes": hosts, "kind": "nccl", "params": {"op": "all_reduce", "max_bytes": 268435456}, "batch_size": 2}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert_eq!(body["state"], "running");
    assert_eq!(body["analysis"]["verdict"], "pending");
    assert_eq!(body["progress"]["pairs_total"], 10);
    assert_eq!(
        body["progress"]["pairs_running"], 2,
        "the first batch starts at once"
    );
    let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let inv = wait_done(&api, &token, id).await;
    let claims = fleet.stop().await;
    assert_eq!(inv.state, InvestigationState::Done, "{:?}", inv.analysis);
    assert_eq!(
        inv.analysis.verdict,
        Conclusion::Culprit,
        "{}",
        inv.analysis.summary
    );
    assert_eq!(
        named(&inv),
        vec![(CulpritKind::Node, vec!["hand-c".to_string()])],
        "{}",
        inv.analysis.summary
    );
    let c = &inv.analysis.culprits[0];
    assert!(
        (c.figure - SLOW * 0.99).abs() < 1.0 && c.median > GOOD * 0.99,
        "{c:?}"
    );
    assert_eq!(c.figures.len(), 4);
    assert!(
        inv.analysis.summary.contains("node hand-c is bad"),
        "{}",
        inv.analysis.summary
    );
    assert_eq!(inv.progress.pairs_done, 10);
    assert_eq!(
        inv.progress.batches_total, 5,
        "5 rounds of 2 pairs (one node sits each out), in batches of 2"
    );
    assert_eq!(inv.matrix.labels, hosts);
    assert_eq!(inv.matrix.values[0][0], None);
    assert_eq!(inv.matrix.values[1][2], inv.matrix.values[2][1]);
    assert!(
        inv.pairs.iter().all(|p| p.size_bytes == Some(1 << 28)),
        "figures at the largest size"
    );
    check_schedule(&server, &inv, &claims, 2).await;
    let (_, list) = api.get("/api/v1/investigations?state=done", &token).await;
    assert_eq!(list[0]["id"], id.to_string());
    assert_eq!(list[0]["verdict"], "culprit");
    assert_eq!(list[0]["culprits"][0]["members"][0], "hand-c");
}

#[tokio::test]
async fn a_fail_verdict_starts_one_that_names_the_degraded_link() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    let hosts = ["auto-a", "auto-b", "auto-c", "auto-d"];
    let fleet = Fleet::start(
        &[&server],
        &hosts,
        Fault::Link("auto-b".into(), "auto-d".into()),
    )
    .await;
    // A slow four-node run; its results are judged "fail" (the verdict contract: one row
    // per result, written by the verdict code on upload; written here directly).
    let run = server
        .start_run(json!({"kind": "nccl", "params": {"op": "all_gather"}, "nodes": hosts}))
        .await;
    let mut auto = None;
    for _ in 0..300 {
        if server.get_run(run.id).await.state == "succeeded" && auto.is_none() {
            sqlx::query(
                "INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, reasons, metric, value, received_at)
                 SELECT r.id, j.run_id, j.node_id, 'nccl.all_gather', 'fail', '[]', 'busbw_gbs', 55, r.received_at
                 FROM results r JOIN jobs j ON j.id = r.job_id
                 WHERE j.run_id = $1
                 ON CONFLICT (result_id, received_at) DO UPDATE SET verdict = 'fail'",
            )
            .bind(run.id)
            .execute(&server.state.db)
            .await
            .unwrap();
            auto = Some(());
        }
        let (_, list) = api.get("/api/v1/investigations", &token).await;
        if let Some(found) = list
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["trigger_run_id"] == run.id.to_string())
        {
            let id: Uuid = found["id"].as_str().unwrap().parse().unwrap();
            let inv = wait_done(&api, &token, id).await;
            // Pair runs judged "fail" too must not start investigations of their own.
            sqlx::query(
                "INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, metric, value, received_at)
                 SELECT r.id, j.run_id, j.node_id, 'nccl.all_gather', 'fail', 'busbw_gbs', 1, r.received_at
                 FROM results r JOIN jobs j ON j.id = r.job_id
                 WHERE j.run_id = ANY($1) ON CONFLICT (result_id, received_at) DO UPDATE SET verdict = 'fail'",
            )
            .bind(&inv.runs)
            .execute(&server.state.db)
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let claims = fleet.stop().await;
            assert_eq!(inv.state, InvestigationState::Done);
            assert_eq!(inv.created_by, "heddle:investigate");
            assert_eq!(inv.params["op"], "all_gather", "the run's own params");
            assert_eq!(
                inv.analysis.verdict,
                Conclusion::Culprit,
                "{}",
                inv.analysis.summary
            );
            assert_eq!(
                named(&inv),
                vec![(
                    CulpritKind::Link,
                    vec!["auto-b".to_string(), "auto-d".to_string()]
                )],
                "{}",
                inv.analysis.summary
            );
            assert!((inv.analysis.culprits[0].figure - SLOW * 0.99).abs() < 1.0);
            check_schedule(&server, &inv, &claims, 0).await;
            let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM investigations")
                .fetch_one(&server.state.db)
                .await
                .unwrap();
            assert_eq!(
                n, 1,
                "one investigation per failing run, none for the pair runs"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no investigation was started for run {}", run.id);
}

#[tokio::test]
async fn two_replicas_advance_it_and_start_each_pair_once() {
    let first = TestServer::start().await;
    let second = TestServer::start_on(&first.database_url(), |_| {}).await;
    let api = Api::new(&first);
    let token = first.admin_token.clone();
    let hosts = ["rep-a", "rep-b", "rep-c", "rep-d"];
    let fleet = Fleet::start(&[&first, &second], &hosts, Fault::Node("rep-a".into())).await;
    let (s, body) = api
        .post(
            "/api/v1/investigations",
            &token,
            json!({"nodes": hosts, "kind": "nccl", "batch_size": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let inv = wait_done(&Api::new(&second), &token, id).await;
    let claims = fleet.stop().await;
    assert_eq!(
        named(&inv),
        vec![(CulpritKind::Node, vec!["rep-a".to_string()])],
        "{}",
        inv.analysis.summary
    );
    check_schedule(&first, &inv, &claims, 1).await;
    second.stop().await;
}

#[tokio::test]
async fn failed_pairs_make_it_inconclusive() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let token = server.admin_token.clone();
    let hosts = ["fail-a", "fail-b", "fail-c", "fail-d"];
    let fleet = Fleet::start(&[&server], &hosts, Fault::Failing("fail-b".into())).await;
    let (s, body) = api
        .post(
            "/api/v1/investigations",
            &token,
            json!({"nodes": hosts, "kind": "rdma", "params": {"test": "ib_write_bw"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let inv = wait_done(&api, &token, body["id"].as_str().unwrap().parse().unwrap()).await;
    fleet.stop().await;
    assert_eq!(inv.state, InvestigationState::Done);
    assert_eq!(
        inv.analysis.verdict,
        Conclusion::Inconclusive,
        "{}",
        inv.analysis.summary
    );
    assert_eq!(inv.progress.pairs_failed, 3);
    assert_eq!(inv.analysis.missing.len(), 3);
    assert!(
        inv.analysis
            .summary
            .contains("every pair of node fail-b failed"),
        "{}",
        inv.analysis.summary
    );
    let failed = inv.pairs.iter().find(|p| p.error.is_some()).unwrap();
    assert!(
        failed
            .error
            .as_deref()
            .unwrap()
            .contains("fail-b failed: NCCL WARN NET/IB: peer unreachable"),
        "{failed:?}"
    );
    assert_eq!(inv.matrix.metric, "algbw_gbs");
}
