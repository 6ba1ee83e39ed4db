//! What every command shares, against the real binary: shell completions, exit codes that
//! tell a failed test from a server that cannot be reached, hostlists for `--nodes`, and
//! progress that stays plain text off a terminal and silent with `--json`.

mod common;

use std::process::{Command, Stdio};

use common::{claim, enroll, heddle, heddle_as, upload};
use heddle_server::testing::TestServer;
use serde_json::{Value, json};

fn heddle_offline(args: &[&str]) -> (i32, String, String) {
    heddle_as("http://127.0.0.1:9", "none", args)
}

#[test]
fn completions_render_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = heddle_offline(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        // Subcommands, and flags (fish writes them without their dashes).
        for word in ["investigate", "preflight", "max-age", "expires-in"] {
            assert!(out.contains(word), "{shell} completion lacks {word}");
        }
    }
    let (_, bash, _) = heddle_offline(&["completions", "bash"]);
    let file = std::env::temp_dir().join(format!("heddle-{}.bash", uuid::Uuid::new_v4()));
    std::fs::write(&file, &bash).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let (code, _, err) = heddle_offline(&["completions", "tcsh"]);
    assert_eq!(code, 5, "an unknown shell is a usage error: {err}");
}

#[test]
fn help_documents_the_exit_codes_and_usage_errors_exit_5() {
    let (code, out, _) = heddle_offline(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Exit codes:"), "{out}");
    assert!(out.contains("3  the server cannot be reached"), "{out}");
    let (code, _, err) = heddle_offline(&["runs", "start", "--kind"]);
    assert_eq!(code, 5, "{err}");
    let (code, _, err) = heddle_offline(&["preflight", "--nodes", "n[1-99999999]"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("more than 4096"), "{err}");
    let (code, _, err) = heddle_offline(&["preflight", "--nodes", "a", "--max-age", "soon"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("not a duration"), "{err}");
    let (code, _, err) = heddle_offline(&["whoami"]);
    assert_eq!(code, 3, "{err}");
}

/// Starts a memcpy run on `node` through the CLI; its id.
fn start(server: &TestServer, nodes: &str) -> Value {
    let (code, out, err) = heddle(
        server,
        &[
            "runs",
            "start",
            "--kind",
            "memcpy",
            "--nodes",
            nodes,
            "--timeout",
            "2m",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.is_empty(), "--json prints nothing else: {err}");
    serde_json::from_str(&out).unwrap()
}

fn result(key: &str, outcome: &str, gbs: f64) -> Value {
    json!({"upload_key": key, "outcome": outcome, "reason": (outcome == "failed").then_some("bandwidth test crashed"),
        "rows": [{"size_bytes": 64 << 20, "op": "memcpy", "algbw_gbs": gbs, "wrong": 0}],
        "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:01Z"})
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_watch_exit_codes_and_plain_progress() {
    let server = TestServer::start().await;
    let cred = enroll(&server, "watch-01").await;
    enroll(&server, "watch-02").await;

    // Hostlists expand in order, with their zero padding.
    let run = start(&server, "watch-[01-02]");
    let hosts: Vec<&str> = run["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["hostname"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["watch-01", "watch-02"]);
    assert_eq!(run["spec"]["timeout_s"], 120);
    let id = run["id"].as_str().unwrap().to_string();
    let (code, _, err) = heddle(&server, &["runs", "cancel", &id]);
    assert_eq!(code, 0, "{err}");

    // `runs watch` started before the test ends: stderr is a pipe here, so its progress
    // is one plain line per change.
    let run = start(&server, "watch-01");
    let id = run["id"].as_str().unwrap().to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args(["runs", "watch", &id])
        .env("HEDDLE_URL", &server.url)
        .env("HEDDLE_TOKEN", &server.admin_token)
        .env(
            "HEDDLE_CONFIG",
            std::env::temp_dir().join("heddle-none.json"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let lease = claim(&server, &cred).await.expect("the memcpy job");
    upload(&server, &cred, &lease, &result("w-1", "failed", 0.0)).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed test exits 1: {stderr}"
    );
    assert!(stderr.contains("0/1 jobs done"), "{stderr}");
    assert!(
        stderr.contains("failed: 1/1 jobs done, 1 failed"),
        "{stderr}"
    );
    assert!(
        !stderr.contains('\x1b') && !stdout.contains('\x1b'),
        "no escape codes off a terminal: {stderr:?}"
    );
    assert!(stdout.contains("bandwidth test crashed"), "{stdout}");

    // With --json: the JSON on stdout and nothing on stderr.
    let (code, out, err) = heddle(&server, &["runs", "watch", &id, "--json"]);
    assert_eq!(code, 1);
    assert!(err.is_empty(), "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["run"]["state"], "failed");

    // A test that ran but was judged FAIL fails too; one that clears the bar passes.
    let (code, _, err) = heddle(
        &server,
        &[
            "expectations",
            "add",
            "--test",
            "memcpy",
            "--metric",
            "algbw_gbs",
            "--value",
            "10",
            "--source",
            "site acceptance",
        ],
    );
    assert_eq!(code, 0, "{err}");
    for (key, gbs, want) in [("w-2", 8.0, 1), ("w-3", 12.0, 0)] {
        let run = start(&server, "watch-01");
        let lease = claim(&server, &cred).await.expect("the memcpy job");
        upload(&server, &cred, &lease, &result(key, "succeeded", gbs)).await;
        let id = run["id"].as_str().unwrap();
        let (code, out, err) = heddle(&server, &["runs", "watch", id]);
        assert_eq!(code, want, "{gbs} GB/s: {out}{err}");
    }

    // Errors are not failed tests: a refused token, an unknown run, no server.
    let (code, _, err) = heddle_as(&server.url, "hdl_wrong", &["runs", "watch", &id]);
    assert_eq!(code, 4, "{err}");
    let unknown = uuid::Uuid::new_v4().to_string();
    let (code, _, err) = heddle(&server, &["runs", "watch", &unknown]);
    assert_eq!(code, 5, "{err}");
    let (url, token) = (server.url.clone(), server.admin_token.clone());
    server.stop().await;
    let (code, _, err) = heddle_as(&url, &token, &["runs", "watch", &id]);
    assert_eq!(code, 3, "an unreachable server exits 3, not 1: {err}");
    assert!(err.contains("cannot reach"), "{err}");
}
