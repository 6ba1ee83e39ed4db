//! Runs apply the node's recommended environment: a recommendation stored for the node
//! reaches the test process (the `env` kind reports what it got), `recommended_env:
//! false` leaves it out, and the run records what was applied and where it came from.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use heddle_types::jobs::Run;
use serde_json::json;

mod lifecycle_support;
use lifecycle_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recommendations_reach_the_test_process_unless_refused() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let agent = enrolled_agent(&server, &dir.path().join("state")).await;
    let api = Api::new(&server);
    let status = api
        .http
        .put(format!("{}/api/v1/nodes/{HOST}/recommendations", api.base))
        .bearer_auth(&api.token)
        .json(&json!({"source": "site-policy", "items": [
            {"name": "NCCL_IB_HCA", "value": "mlx5_0,mlx5_1", "reason": "the InfiniBand HCAs"},
            {"name": "UCX_TLS", "value": "rc,sm,self", "reason": "RDMA first"}
        ]}))
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "{status}");

    // The run's own env overrides a recommendation of the same name.
    let with = start_run(&server, json!({"kind": "env", "env": {"UCX_TLS": "tcp"}})).await;
    let run: Run = api.wait_run(with, "succeeded", &agent).await;
    let got = &api.results(with).await[0].summary["env"];
    assert_eq!(got["NCCL_IB_HCA"], "mlx5_0,mlx5_1", "{got}");
    assert_eq!(got["UCX_TLS"], "tcp", "{got}");
    let applied: Vec<(&str, &str, &str)> = run.jobs[0]
        .applied_env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_str(), e.source.as_str()))
        .collect();
    assert_eq!(
        applied,
        [
            ("NCCL_IB_HCA", "mlx5_0,mlx5_1", "site-policy"),
            ("UCX_TLS", "tcp", "run")
        ]
    );

    let without = start_run(
        &server,
        json!({"kind": "env", "env": {"UCX_TLS": "tcp"}, "recommended_env": false}),
    )
    .await;
    let run: Run = api.wait_run(without, "succeeded", &agent).await;
    let got = &api.results(without).await[0].summary["env"];
    assert!(got.get("NCCL_IB_HCA").is_none(), "{got}");
    assert_eq!(got["UCX_TLS"], "tcp");
    assert_eq!(run.jobs[0].applied_env.len(), 1);
}
