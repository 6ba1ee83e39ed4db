//! `heddle runs sweep` against a real server, on a sweep result uploaded through the agent
//! protocol: the table, `--json`, and `--keep` storing the winner as a tuning profile.

mod common;

use common::{claim, enroll, heddle, upload};
use heddle_server::testing::TestServer;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn runs_sweep_shows_winners_and_keeps_one() {
    let server = TestServer::start().await;
    let cred = enroll(&server, "sweep-cli").await;
    let run = server
        .start_run(json!({"kind": "sweep", "nodes": ["sweep-cli"], "params": {"grid": {"NCCL_PROTO": ["Simple", "LL"]}}}))
        .await;
    let lease = claim(&server, &cred).await.expect("the sweep's job");
    let mut rows = Vec::new();
    for (proto, small, large) in [("Simple", 0.5, 301.8), ("LL", 0.9, 120.4)] {
        for (size, busbw) in [(1024u64, small), (256u64 << 20, large)] {
            rows.push(json!({"size_bytes": size, "time_us": 10.0, "algbw_gbs": busbw, "busbw_gbs": busbw, "wrong": 0,
                "labels": {"NCCL_PROTO": proto}}));
        }
    }
    let body = json!({"upload_key": "cli-sweep", "outcome": "succeeded", "summary": {}, "rows": rows,
        "started_at": "2026-11-23T10:00:00Z", "finished_at": "2026-11-23T10:01:00Z"});
    upload(&server, &cred, &lease, &body).await;
    let id = run.id.to_string();

    let (code, out, err) = heddle(&server, &["runs", "sweep", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("NCCL_PROTO=Simple") && out.contains("301.80"),
        "{out}"
    );
    let small = out
        .lines()
        .find(|l| l.contains("small"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        small.contains("NCCL_PROTO=LL") && small.contains("0.90") && small.contains("0.50"),
        "{out}"
    );

    // `--watch` on a sweep that has ended: no wait, no escape codes, the same table.
    let (code, watched, err) = heddle(&server, &["runs", "sweep", &id, "--watch"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(watched, out);
    assert!(
        err.contains("1/1 jobs done") && !err.contains('\x1b'),
        "{err}"
    );

    let (code, out, err) = heddle(&server, &["runs", "sweep", &id, "--json"]);
    assert_eq!(code, 0, "{err}");
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["winners"][1]["band"], "large");
    assert_eq!(t["winners"][1]["env"]["NCCL_PROTO"], "Simple");

    let (code, out, err) = heddle(&server, &["runs", "sweep", &id, "--keep", "simple-large"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("kept tuning profile simple-large") && out.contains("NCCL_PROTO=Simple"),
        "{out}"
    );
    let (code, _, err) = heddle(&server, &["runs", "sweep", &id, "--keep", "simple-large"]);
    assert_ne!(code, 0);
    assert!(err.contains("already exists"), "{err}");
    let (code, _, err) = heddle(
        &server,
        &["runs", "sweep", &id, "--keep", "x", "--band", "huge"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("unknown band"), "{err}");
}
