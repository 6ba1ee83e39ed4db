//! A `ucx` run across two nodes, end to end: two real `heddle-agent run` processes (two
//! "nodes" on this machine) against a real server. Rank 0 starts `ucx_perftest` as a
//! server and publishes its address through the server's rendezvous; rank 1 reads it and
//! runs the client. UCX is held to TCP so the pair talks over loopback sockets, as two
//! hosts would, rather than shared memory.

mod lifecycle_support;

use heddle_agent::runner::ucx;
use heddle_types::jobs::{JobState, Outcome};
use lifecycle_support::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_run_ucx_perftest_through_the_rendezvous() {
    if ucx::which("ucx_perftest").is_none() {
        eprintln!("SKIPPED: ucx_perftest is not installed (apt-get install ucx-utils)");
        return;
    }
    let server = server(1).await;
    let api = Api::new(&server);
    let tmp = tempfile::tempdir().unwrap();
    let (ta, tb) = (
        server.enrollment_token().await,
        server.enrollment_token().await,
    );
    let a = Agent::start_named(
        "ucx-a",
        &[&server.url],
        Some(&ta),
        &tmp.path().join("a"),
        &[],
    );
    let b = Agent::start_named(
        "ucx-b",
        &[&server.url],
        Some(&tb),
        &tmp.path().join("b"),
        &[],
    );
    for (host, agent) in [("ucx-a", &a), ("ucx-b", &b)] {
        eventually(&format!("{host} with facts"), agent, || async {
            api.fetch::<heddle_types::nodes::NodeDetail>(&format!("/nodes/{host}"))
                .await
                .filter(|n| n.facts.is_some())
        })
        .await;
    }
    let run = server
        .start_run(json!({
            "kind": "ucx",
            "nodes": ["ucx-a", "ucx-b"],
            "params": {"tests": ["tag_lat", "tag_bw"], "sizes": [8, 65536], "iters": 2000, "warmup": 100, "server_host": "127.0.0.1"},
            "env": {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"},
            "timeout_s": 120,
        }))
        .await;
    let done = eventually(&format!("run {} finished", run.id), &b, || async {
        api.run(run.id)
            .await
            .filter(|r| r.jobs.iter().all(|j| j.state.is_terminal()))
    })
    .await;
    let results = api.results(run.id).await;
    assert_eq!(done.state, "succeeded", "{done:?}\n{results:#?}");
    assert!(done.jobs.iter().all(|j| j.state == JobState::Succeeded));
    assert_eq!(results.len(), 2);
    let (server_side, client_side) = (&results[0], &results[1]);
    assert_eq!(
        (server_side.hostname.as_str(), client_side.hostname.as_str()),
        ("ucx-a", "ucx-b")
    );
    assert!(results.iter().all(|r| r.outcome == Outcome::Succeeded));
    assert_eq!(server_side.summary["mode"], "two-node");
    assert!(
        server_side.rows.is_empty(),
        "the server side reports no figures"
    );
    // The client measured every (test, size) step against rank 0's server, whose port is
    // picked at random on rank 0: rank 1 can only have learnt it through the rendezvous.
    let steps: Vec<(String, i64)> = client_side
        .rows
        .iter()
        .map(|r| (r.op.clone().unwrap(), r.size_bytes))
        .collect();
    assert_eq!(
        steps,
        vec![
            ("tag_lat".into(), 8),
            ("tag_lat".into(), 65536),
            ("tag_bw".into(), 8),
            ("tag_bw".into(), 65536)
        ]
    );
    for r in &client_side.rows {
        assert!(
            r.time_us.unwrap() > 0.0 && r.algbw_gbs.unwrap() > 0.0,
            "{r:?}"
        );
        assert_eq!(r.extra["iterations"], 2000);
    }
    assert!(
        client_side.summary["ucx_env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "UCX_TLS=tcp")
    );
}
