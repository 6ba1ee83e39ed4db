//! The `heddle` binary against a real server.

mod common;

use common::{enroll_with, run_heddle};
use heddle_server::testing::TestServer;
use serde_json::Value;

struct Heddle {
    url: String,
    token: String,
    config: std::path::PathBuf,
}

impl Heddle {
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        run_heddle(&self.url, &self.token, &self.config, args)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let (code, out, err) = self.run(&all);
        assert_eq!(code, 0, "{args:?}: {err}");
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {out}"))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_drives_the_api() {
    let server = TestServer::start().await;
    let dir = std::env::temp_dir().join(format!("heddle-cli-{}", uuid::Uuid::new_v4()));
    let h = Heddle {
        url: server.url.clone(),
        token: server.admin_token.clone(),
        config: dir.join("cli.json"),
    };
    login_writes_a_private_config(&h);
    an_agent_enrolls_with_a_token_the_cli_makes(&server, &h).await;
    a_run_started_cancelled_and_watched(&h);
    the_node_env_in_both_formats(&h);
    a_token_created_and_listed(&h);
    a_plugin_uploaded_and_enabled(&h, &dir);
    a_plugin_tested_locally(&h);
    errors_say_what_kind_they_are(&server, &h, &dir);
    let _ = std::fs::remove_dir_all(dir);
}

fn login_writes_a_private_config(h: &Heddle) {
    let (code, out, err) = h.run(&["login"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("admin-from-config (admin)"), "{out}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&h.config).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

async fn an_agent_enrolls_with_a_token_the_cli_makes(server: &TestServer, h: &Heddle) {
    let (code, token, err) = h.run(&["agents", "enroll-token", "--max-uses", "2"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("heddle-agent run --server"), "{err}");
    enroll_with(server, token.trim(), "cli-node").await;

    let nodes = h.json(&["nodes", "ls"]);
    assert_eq!(nodes[0]["hostname"], "cli-node");
    let (code, table, _) = h.run(&["nodes", "ls"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("cli-node") && table.contains("LIVENESS"),
        "{table}"
    );
    // The server filters: free text, and problems (this node has sent no facts yet).
    let found = h.json(&["nodes", "ls", "--search", "cli-no"]);
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    let none = h.json(&["nodes", "ls", "--search", "no-such-node"]);
    assert_eq!(none.as_array().map(Vec::len), Some(0), "{none}");
    assert_eq!(
        h.json(&["nodes", "ls", "--problems"])[0]["hostname"],
        "cli-node"
    );
    assert_eq!(
        h.json(&["nodes", "show", "cli-node"])["hostname"],
        "cli-node"
    );
}

fn a_run_started_cancelled_and_watched(h: &Heddle) {
    let run = h.json(&[
        "runs",
        "start",
        "--kind",
        "memcpy",
        "--nodes",
        "cli-node",
        "--param",
        "max_bytes=1048576",
        "--env",
        "NCCL_ALGO=Ring",
    ]);
    assert_eq!(run["spec"]["params"]["max_bytes"], 1048576);
    assert_eq!(run["spec"]["env"]["NCCL_ALGO"], "Ring");
    let id = run["id"].as_str().unwrap().to_string();
    assert_eq!(h.json(&["runs", "ls"]).as_array().unwrap().len(), 1);
    let cancelled = h.json(&["runs", "cancel", &id]);
    assert_eq!(cancelled["state"], "cancelled");
    let (code, _, err) = h.run(&["runs", "watch", &id]);
    assert_eq!(code, 7, "a cancelled run has no verdict: {err}");
}

fn the_node_env_in_both_formats(h: &Heddle) {
    let (code, env, _) = h.run(&["env", "cli-node"]);
    assert_eq!(code, 0);
    assert!(env.starts_with("# Heddle environment"), "{env}");
    // The node env file the agent writes for the NCCL environment plugin, same renderer.
    let (code, conf, err) = h.run(&["env", "cli-node", "--format", "nccl-conf"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        conf.starts_with("# Heddle environment for node cli-node\n# job env sha256 "),
        "{conf}"
    );
    assert!(
        conf.contains("# written by heddle-agent; do not edit\n"),
        "{conf}"
    );
    heddle_types::nccl_conf::parse(conf.as_bytes()).unwrap();
}

fn a_token_created_and_listed(h: &Heddle) {
    let (code, secret, _) = h.run(&["tokens", "create", "--name", "ci", "--role", "viewer"]);
    assert_eq!(code, 0);
    assert!(secret.trim().starts_with("hdl_"));
    let tokens = h.json(&["tokens", "ls"]);
    assert!(
        tokens
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "ci" && t["role"] == "viewer")
    );
}

/// A component uploaded and enabled; what is not one refused.
fn a_plugin_uploaded_and_enabled(h: &Heddle, dir: &std::path::Path) {
    let wasm =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist/template.wasm");
    assert!(
        wasm.exists(),
        "build the plugins first: scripts/build-plugins.sh"
    );
    let v = h.json(&[
        "plugins",
        "upload",
        wasm.to_str().unwrap(),
        "--name",
        "demo",
        "--version",
        "1.0.0",
    ]);
    assert_eq!(v["size_bytes"], std::fs::metadata(&wasm).unwrap().len());
    let not_wasm = dir.join("garbage.wasm");
    std::fs::write(&not_wasm, b"garbage").unwrap();
    let (code, _, err) = h.run(&[
        "plugins",
        "upload",
        not_wasm.to_str().unwrap(),
        "--name",
        "demo",
        "--version",
        "1.0.1",
    ]);
    assert_eq!(code, 5, "a refused upload exits 5");
    assert!(err.contains("not a WebAssembly binary"), "{err}");
    let p = h.json(&["plugins", "enable", "demo"]);
    assert_eq!(p["active_version"], "1.0.0");
}

/// Local plugin test, no server needed.
fn a_plugin_tested_locally(h: &Heddle) {
    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
    let roce = dist.join("dist/runai-roce.wasm");
    let facts = dist.join("fixtures/runai-roce.json");
    let (code, out, err) = h.run(&[
        "plugin",
        "test",
        roce.to_str().unwrap(),
        "--facts",
        facts.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("env      NCCL_IB_GID_INDEX=9"), "{out}");
    assert!(err.contains("fuel"), "{err}");
    let report = h.json(&[
        "plugin",
        "test",
        roce.to_str().unwrap(),
        "--facts",
        facts.to_str().unwrap(),
    ]);
    assert!(report["usage"]["fuel_consumed"].as_u64().unwrap() > 0);
    let hostile = std::env::temp_dir().join(format!("hostile-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&hostile, r#"{"hostile": "loop"}"#).unwrap();
    let (code, _, err) = h.run(&[
        "plugin",
        "test",
        dist.join("dist/misbehave.wasm").to_str().unwrap(),
        "--facts",
        hostile.to_str().unwrap(),
        "--fuel",
        "10000000",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("fuel-exhausted"), "{err}");
    let _ = std::fs::remove_file(hostile);
}

/// Errors carry the server's message, and exit codes that say what kind of error.
fn errors_say_what_kind_they_are(server: &TestServer, h: &Heddle, dir: &std::path::Path) {
    let (code, _, err) = h.run(&["nodes", "show", "nope"]);
    assert_eq!(code, 5, "not found");
    assert!(
        err.contains("no node with id or hostname \"nope\""),
        "{err}"
    );
    let bad = Heddle {
        url: server.url.clone(),
        token: "hdl_wrong".into(),
        config: dir.join("none.json"),
    };
    let (code, _, err) = bad.run(&["nodes", "ls"]);
    assert_eq!(code, 4, "a refused token");
    assert!(err.contains("401"), "{err}");
    let gone = Heddle {
        url: "http://127.0.0.1:9".into(),
        token: "x".into(),
        config: dir.join("none.json"),
    };
    let (code, _, err) = gone.run(&["whoami"]);
    assert_eq!(code, 3, "unreachable");
    assert!(err.contains("cannot reach the Heddle server"), "{err}");
}
