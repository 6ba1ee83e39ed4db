//! The admission webhook as the API server reaches it: over HTTPS, without a token, with
//! the review as the body. Its own body limit (the API server's 3 MiB, above the API's
//! 1 MiB) and its switch.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use base64::Engine;
use heddle_server::k8s_admission::{MAX_REVIEW_BYTES, ReviewOut};
use heddle_server::testing::TestServer;
use heddle_tls::test_ca::TestCa;

const WORKER: &str = include_str!("../src/k8s_admission/testdata/pytorchjob-worker.json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_gets_a_patch_over_tls_and_big_bodies_are_bounded() {
    let ca = TestCa::new();
    let files = ca.write_server_files("localhost");
    let server = TestServer::start_https(&files, |c| c.k8s_admission.k8s_admission = true).await;
    let url = format!("{}/k8s/admission/v1/mutate", server.url);
    let post = |body: Vec<u8>| {
        server
            .client()
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let resp = post(WORKER.as_bytes().to_vec()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let out: ReviewOut = resp.json().await.unwrap();
    assert!(out.response.allowed);
    assert_eq!(out.response.patch_type.as_deref(), Some("JSONPatch"));
    let patch = base64::engine::general_purpose::STANDARD
        .decode(out.response.patch.unwrap())
        .unwrap();
    assert!(
        String::from_utf8(patch)
            .unwrap()
            .contains("libnccl-env-heddle.so")
    );

    // A 2 MiB pod (a large annotation) is within the API server's limit: answered.
    let mut doc: serde_json::Value = serde_json::from_str(WORKER).unwrap();
    doc["request"]["object"]["metadata"]["annotations"]["big"] = "x".repeat(2 << 20).into();
    let resp = post(serde_json::to_vec(&doc).unwrap()).await.unwrap();
    assert_eq!(resp.status(), 200);
    let out: ReviewOut = resp.json().await.unwrap();
    assert!(out.response.patch.is_some());

    // Beyond it: refused without reading on (the API server then admits the pod unchanged,
    // failurePolicy Ignore).
    let resp = post(vec![b' '; MAX_REVIEW_BYTES + 1]).await.unwrap();
    assert_eq!(resp.status(), 413);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_is_off_unless_asked_for() {
    let server = TestServer::start().await;
    let resp = server
        .client()
        .post(format!("{}/k8s/admission/v1/mutate", server.url))
        .body(WORKER)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    server.stop().await;
}
