//! What the server's API tests share beyond the kit (`heddle_testkit`, re-exported
//! here): a result body, the error shape, and one pass of the plugin reconciler.
#![allow(dead_code, unused_imports)]

pub use heddle_testkit::files::{dist, fixture_facts};
pub use heddle_testkit::{Api, FakeAgent, enroll, enroll_with, eventually};
use serde_json::{Value, json};

pub fn result_body(key: &str, outcome: &str) -> Value {
    json!({
        "upload_key": key,
        "outcome": outcome,
        "summary": {"tool": "test"},
        "rows": [
            {"size_bytes": 8, "count": 2, "dtype": "float", "op": "sum", "time_us": 10.5, "algbw_gbs": 0.0, "busbw_gbs": 0.0, "wrong": 0},
            {"size_bytes": 1048576, "count": 262144, "dtype": "float", "op": "sum", "time_us": 20.0, "algbw_gbs": 52.4, "busbw_gbs": 52.4, "wrong": 0,
             "labels": {"NCCL_ALGO": "Ring"}}
        ],
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z"
    })
}

/// Asserts the `{error, message}` shape and returns the error code.
pub fn error_code(body: &Value) -> &str {
    assert!(
        body["message"].is_string(),
        "error body without message: {body}"
    );
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("error body without code: {body}"))
}

/// One pass of the plugin reconciler on this replica's state, as its worker runs it.
pub async fn reconcile(state: &heddle_server::AppState) -> anyhow::Result<usize> {
    let hold = std::time::Duration::from_millis(state.config.reconciler_hold_ms);
    heddle_server::plugins::reconcile(&state.db, &state.plugins, &state.job_env_seen, hold).await
}
