//! End to end: a node tuning profile changes on the server → the agent rewrites the node env
//! file → Heddle's NCCL environment plugin, the built library loaded by `dlopen` as NCCL
//! loads it with `HEDDLE_NCCL_ENV_FILE` naming that file, answers the new value.
//!
//! The plugin applies only a root-owned file; the agent writes it as the user running the
//! test. So the plugin part runs only as root (as CI does) and says so otherwise; the
//! server-to-file part always runs.

mod lifecycle_support;

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::process::Command;

use heddle_types::agent::NodeJobEnv;
use lifecycle_support::*;
use serde_json::json;

const PROFILER: &str = "/opt/heddle/lib/libnccl-profiler-heddle.so";

#[repr(C)]
struct NcclEnvV1 {
    name: *const c_char,
    init: unsafe extern "C" fn(u8, u8, u8, *const c_char) -> c_int,
    finalize: unsafe extern "C" fn() -> c_int,
    get_env: unsafe extern "C" fn(*const c_char) -> *const c_char,
}

fn built_plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .map(|dir| dir.join("libheddle_nccl_env.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libheddle_nccl_env.so was not built near {}; run `cargo test -p heddle-agent --test node_env_plugin`",
                exe.display()
            )
        })
}

/// In a child process only: load the plugin, init, print `NCCL_IB_HCA`'s answer and the
/// applied file hash.
#[test]
fn plugin_probe() {
    if std::env::var_os("HEDDLE_NODE_ENV_PROBE").is_none() {
        return;
    }
    // SAFETY: the library's load runs no initialiser with preconditions.
    let lib = unsafe { libloading::Library::new(built_plugin()) }.unwrap();
    let plugin: &NcclEnvV1 =
        unsafe { &**lib.get::<*const NcclEnvV1>(b"ncclEnvPlugin_v1\0").unwrap() };
    let applied: libloading::Symbol<extern "C" fn() -> *const c_char> =
        unsafe { lib.get(b"heddle_nccl_env_applied\0") }.unwrap();
    assert_eq!(unsafe { (plugin.init)(2, 28, 9, c"".as_ptr()) }, 0);
    for name in ["NCCL_IB_HCA", "NCCL_ALGO", "NCCL_PROFILER_PLUGIN"] {
        let n = CString::new(name).unwrap();
        let v = unsafe { (plugin.get_env)(n.as_ptr()) };
        if v.is_null() {
            println!("ANSWER {name} NULL");
        } else {
            println!(
                "ANSWER {name}={}",
                unsafe { CStr::from_ptr(v) }.to_str().unwrap()
            );
        }
    }
    let sha = applied();
    assert!(!sha.is_null(), "the plugin applied no file");
    println!(
        "APPLIED {}",
        unsafe { CStr::from_ptr(sha) }.to_str().unwrap()
    );
    assert_eq!(unsafe { (plugin.finalize)() }, 0);
}

/// What the plugin, in a fresh process reading `file`, answers.
fn plugin_answers(file: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "plugin_probe", "--nocapture", "--test-threads=1"])
        .env("HEDDLE_NODE_ENV_PROBE", "1")
        .env("HEDDLE_NCCL_ENV_FILE", file)
        .env_remove("NCCL_IB_HCA")
        .env_remove("NCCL_ALGO")
        .env_remove("NCCL_PROFILER_PLUGIN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

async fn wait_for_file(file: &Path, agent: &Agent, want: &str) -> String {
    eventually(&format!("node env file with {want}"), agent, || async {
        std::fs::read_to_string(file)
            .ok()
            .filter(|t| t.contains(want))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_change_reaches_the_plugin_through_the_agents_file() {
    let server = server(1).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etc").join("nccl.env");
    let token = server.enrollment_token().await;
    let agent = Agent::start_with(
        &[&server.url],
        Some(&token),
        &dir.path().join("state"),
        &[
            "--nccl-env-file",
            file.to_str().unwrap(),
            "--nccl-profiler-plugin",
            PROFILER,
        ],
    );
    let api = Api::new(&server);
    let create = |name: &str, env: serde_json::Value| {
        let body = json!({"name": name, "node": HOST, "env": env});
        let (http, base, token) = (api.http.clone(), api.base.clone(), api.token.clone());
        async move {
            let resp = http
                .post(format!("{base}/api/v1/tuning-profiles"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 201);
            resp.json::<serde_json::Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    // Before any profile the file exists with the profiler line only.
    let text = wait_for_file(&file, &agent, "NCCL_PROFILER_PLUGIN=").await;
    assert!(!text.contains("NCCL_IB_HCA"), "{text}");

    let first = create(
        "fabric-a",
        json!({"NCCL_IB_HCA": "mlx5_0:1", "NCCL_SOCKET_IFNAME": "ib0", "NCCL_ALGO": "Ring"}),
    )
    .await;
    let text = wait_for_file(&file, &agent, "NCCL_IB_HCA=mlx5_0:1\n").await;
    assert!(text.contains("NCCL_SOCKET_IFNAME=ib0\n"), "{text}");
    // NCCL_ALGO must be equal on every rank of a communicator; this node has no site, so
    // no agreement with the nodes its jobs span can be shown and the file leaves it out.
    assert!(!text.contains("NCCL_ALGO"), "{text}");
    assert!(
        text.contains("# written by heddle-agent; do not edit\n"),
        "{text}"
    );
    // The file is what `heddle env NODE --format nccl-conf` renders, plus the profiler.
    let env: NodeJobEnv = api.fetch(&format!("/nodes/{HOST}/job-env")).await.unwrap();
    assert_eq!(
        text,
        heddle_types::nccl_conf::render_node_env(&env.node, &env.entries, Some(PROFILER)).unwrap()
    );

    let root = unsafe { libc::getuid() } == 0;
    if root {
        let out = plugin_answers(&file);
        assert!(out.contains("ANSWER NCCL_IB_HCA=mlx5_0:1\n"), "{out}");
        assert!(
            out.contains(&format!("ANSWER NCCL_PROFILER_PLUGIN={PROFILER}\n")),
            "{out}"
        );
    }

    // The profile changes: another value, and NCCL_SOCKET_IFNAME no longer recommended.
    assert_eq!(
        api.send(
            reqwest::Method::DELETE,
            &format!("/tuning-profiles/{first}")
        )
        .await,
        204
    );
    create("fabric-b", json!({"NCCL_IB_HCA": "mlx5_1:1"})).await;
    let text = wait_for_file(&file, &agent, "NCCL_IB_HCA=mlx5_1:1\n").await;
    assert!(!text.contains("NCCL_SOCKET_IFNAME"), "{text}");
    let meta = std::fs::metadata(&file).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
    assert_eq!(meta.uid(), unsafe { libc::getuid() });

    if !root {
        eprintln!(
            "not root: the plugin applies only a root-owned file, so the dlopen part of this test runs as root (CI)"
        );
        return;
    }
    let out = plugin_answers(&file);
    assert!(out.contains("ANSWER NCCL_IB_HCA=mlx5_1:1\n"), "{out}");
    assert!(out.contains("ANSWER NCCL_ALGO NULL\n"), "{out}");
    let bytes = std::fs::read(&file).unwrap();
    assert!(
        out.contains(&format!("APPLIED {}\n", sha256_hex(&bytes))),
        "{out}"
    );
}
