//! Attacks through environment variables, against a real server and Postgres: variables
//! that load code are refused wherever a job's environment is chosen, and the env export a
//! job script sources is data, never code — checked by sourcing it in a real `bash`.

mod common;

use common::{Api, enroll, error_code};
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::json;

/// Values that would run `touch <marker>` if a shell ever read them as code.
fn hostile_values(marker: &str) -> Vec<(&'static str, String)> {
    vec![
        ("NCCL_ALGO", format!("$(touch {marker})")),
        ("NCCL_PROTO", format!("`touch {marker}`")),
        ("NCCL_IB_HCA", format!("'; touch {marker}; '")),
        ("NCCL_SOCKET_IFNAME", format!("\"; touch {marker}; \"")),
        ("UCX_TLS", format!("tcp;touch {marker}")),
        (
            "UCX_NET_DEVICES",
            format!("a\\' $(touch {marker}) ${{HOME}} !! * ~ #x"),
        ),
        (
            "NCCL_IB_GID_INDEX",
            "é ünïcode, % = {a,b} [x] ^y".to_string(),
        ),
        ("NCCL_DEBUG", String::new()),
    ]
}

#[tokio::test]
async fn sourcing_hostile_recommendations_runs_nothing() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    enroll(&api, &server, "env-hostile").await;
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("pwned");
    let m = marker.to_str().unwrap();
    let path = "/api/v1/nodes/env-hostile/recommendations";

    // The confirmed attack: a newline in the source put a command on a line of its own.
    // Newlines (and every other control character) are refused wherever they may appear;
    // the answers are checked after the export has been sourced, so that a server which
    // took them shows what it leads to.
    let mut answers = Vec::new();
    for body in [
        json!({"source": format!("nl-source\ntouch {m} #"), "items": [{"name": "NCCL_NCHANNELS", "value": "4"}]}),
        json!({"source": "nl-value", "items": [{"name": "NCCL_MIN_NCHANNELS", "value": format!("4\ntouch {m}")}]}),
        json!({"source": "nl-reason", "items": [{"name": "NCCL_MAX_NCHANNELS", "value": "4", "reason": format!("why\ntouch {m}")}]}),
        json!({"source": "nl-cr", "items": [{"name": "NCCL_BUFFSIZE", "value": format!("4\r\ntouch {m}")}]}),
        json!({"source": format!("nl-esc\u{1b}[2K\u{0b}touch {m}"), "items": [{"name": "NCCL_NTHREADS", "value": "64"}]}),
    ] {
        let (s, b) = api
            .call(Method::PUT, path, Some(&admin), Some(body.clone()))
            .await;
        answers.push((format!("PUT {body}"), s, b));
    }
    let (s, b) = api
        .post(
            "/api/v1/tuning-profiles",
            &admin,
            json!({"name": "nl", "node": "env-hostile", "env": {"NCCL_CROSS_NIC": format!("1\ntouch {m}")}}),
        )
        .await;
    answers.push(("tuning profile".into(), s, b));

    // Shell metacharacters without control characters are legitimate data: stored, and
    // exported so that a shell reads them back byte for byte.
    let values = hostile_values(m);
    let items: Vec<_> = values
        .iter()
        .map(|(n, v)| json!({"name": n, "value": v, "reason": format!("because $(touch {m}) `id`; '\"")}))
        .collect();
    let (s, b) = api
        .call(
            Method::PUT,
            path,
            Some(&admin),
            Some(json!({"source": format!("manual $(touch {m}) ';`"), "items": items})),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let (s, text) = api.get("/api/v1/nodes/env-hostile/env", &admin).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let text = text.as_str().unwrap().to_string();
    let file = tmp.path().join("heddle.env");
    std::fs::write(&file, &text).unwrap();
    let mut script = format!("set -u\nsource {}\n", file.display());
    for (name, _) in &values {
        script.push_str(&format!("printf '%s\\0' \"${name}\"\n"));
    }
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("bash");
    assert!(
        !marker.exists(),
        "sourcing the export ran a command:\n{text}"
    );
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (what, s, b) in answers {
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{what} → {b}");
        assert_eq!(error_code(&b), "unprocessable", "{b}");
        let message = b["message"].as_str().unwrap();
        assert!(message.contains("control character"), "{b}");
    }
    let got: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    for (i, (name, value)) in values.iter().enumerate() {
        assert_eq!(
            String::from_utf8_lossy(got[i]),
            value.as_str(),
            "{name}:\n{text}"
        );
    }

    // A row written around the API (or before these checks existed) is refused on the way
    // out too: the export fails, naming the variable, rather than reaching a shell.
    sqlx::query(
        "INSERT INTO recommendations (node_id, source, name, value, reason)
         SELECT id, $1, 'NCCL_PROTO', 'LL', '' FROM nodes WHERE hostname = 'env-hostile'",
    )
    .bind(format!("old\ntouch {m}"))
    .execute(&server.state.db)
    .await
    .unwrap();
    let (s, b) = api.get("/api/v1/nodes/env-hostile/env", &admin).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert!(b["message"].as_str().unwrap().contains("NCCL_PROTO"), "{b}");
    assert!(!marker.exists());
}

#[tokio::test]
async fn ld_preload_in_run_env_is_refused() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    enroll(&api, &server, "env-preload").await;
    for name in [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PATH",
        "HEDDLE_NCCL_LIBRARY",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_DEBUG_FILE",
        "UCX_MODULE_DIR",
    ] {
        let env = json!({ name: "/tmp/evil.so" });
        let refused = |what: &str, s: StatusCode, b: &serde_json::Value| {
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{what} {name}: {b}");
            let msg = b["message"].as_str().unwrap();
            assert!(msg.contains(name), "{what}: {msg}");
        };
        let (s, b) = api
            .post(
                "/api/v1/runs",
                &admin,
                json!({"kind": "nccl", "nodes": ["env-preload"], "env": env}),
            )
            .await;
        refused("run", s, &b);
        let (s, b) = api
            .post(
                "/api/v1/tuning-profiles",
                &admin,
                json!({"name": "p", "node": "env-preload", "env": env}),
            )
            .await;
        refused("tuning profile", s, &b);
        let (s, b) = api
            .call(
                Method::PUT,
                "/api/v1/nodes/env-preload/recommendations",
                Some(&admin),
                Some(
                    json!({"source": "manual", "items": [{"name": name, "value": "/tmp/evil.so"}]}),
                ),
            )
            .await;
        refused("recommendation", s, &b);
    }
    // A sweep sets its grid's variables one cell at a time: the same rule.
    let (s, b) = api
        .post(
            "/api/v1/runs",
            &admin,
            json!({"kind": "sweep", "nodes": ["env-preload"],
                   "params": {"grid": {"NCCL_NET_PLUGIN": ["/tmp/evil.so"]}}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(b["message"].as_str().unwrap().contains("NCCL_NET_PLUGIN"));
    // Nothing was stored.
    let (_, runs) = api.get("/api/v1/runs", &admin).await;
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");
    // The tuning variables themselves still pass.
    let (s, b) = api
        .post(
            "/api/v1/runs",
            &admin,
            json!({"kind": "nccl", "nodes": ["env-preload"], "env": {"NCCL_ALGO": "Ring", "UCX_TLS": "tcp", "CUDA_VISIBLE_DEVICES": "0,1"}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
}

/// The second look at the policy: what an operator could still hand a root process through
/// the families Heddle passes on. Each was answered 201 before.
#[tokio::test]
async fn bootstrap_listeners_profiles_and_hidden_text_are_refused() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    enroll(&api, &server, "env-second").await;
    listeners_and_profilers_are_refused(&api, &admin).await;
    hidden_text_is_refused(&api, &admin).await;
    more_variables_than_a_test_starts_with_are_refused(&api, &admin).await;
    a_hostile_agent_version_is_refused(&server, &api, &admin).await;
    any_language_is_a_label(&api, &admin).await;
}

/// `what` was refused (422) with a message that says `needle`.
fn refused(what: &str, s: StatusCode, b: &serde_json::Value, needle: &str) {
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {b}");
    let msg = b["message"].as_str().unwrap();
    assert!(msg.contains(needle), "{what}: {msg}");
}

async fn listeners_and_profilers_are_refused(api: &Api, admin: &str) {
    for (name, value) in [
        ("NCCL_COMM_ID", "203.0.113.7:5000"),
        ("NCCL_RAS_ADDR", "0.0.0.0:28028"),
        ("UCX_PROFILE_MODE", "log,accum"),
        ("NCCL_PROXY_PROFILE", "/tmp/x"),
    ] {
        let env = json!({ name: value });
        let (s, b) = api
            .post(
                "/api/v1/runs",
                admin,
                json!({"kind": "nccl", "nodes": ["env-second"], "env": env}),
            )
            .await;
        refused("run", s, &b, name);
        let (s, b) = api
            .post(
                "/api/v1/tuning-profiles",
                admin,
                json!({"name": "p2", "node": "env-second", "env": env}),
            )
            .await;
        refused("tuning profile", s, &b, name);
        let (s, b) = api
            .call(
                Method::PUT,
                "/api/v1/nodes/env-second/recommendations",
                Some(admin),
                Some(json!({"source": "manual", "items": [{"name": name, "value": value}]})),
            )
            .await;
        refused("recommendation", s, &b, name);
    }
}

/// Text that reads differently from what it does: a right-to-left override, a line
/// separator, a zero-width space — in a value, a reason and a source; the same in the free
/// text people attach; and a label long enough to fill a screen.
async fn hidden_text_is_refused(api: &Api, admin: &str) {
    for hidden in ["mlx5_0\u{202E}1:5xlm", "a\u{2028}b", "mlx5\u{200B}_0"] {
        let (s, b) = api
            .post(
                "/api/v1/runs",
                admin,
                json!({"kind": "nccl", "nodes": ["env-second"], "env": {"NCCL_IB_HCA": hidden}}),
            )
            .await;
        refused("run value", s, &b, "NCCL_IB_HCA");
        for body in [
            json!({"source": "manual", "items": [{"name": "NCCL_IB_HCA", "value": hidden}]}),
            json!({"source": "manual", "items": [{"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": hidden}]}),
            json!({"source": hidden, "items": [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}]}),
        ] {
            let (s, b) = api
                .call(
                    Method::PUT,
                    "/api/v1/nodes/env-second/recommendations",
                    Some(admin),
                    Some(body.clone()),
                )
                .await;
            assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {b}");
        }
    }
    // The same in the free text people attach: a run's and an investigation's label, a
    // node's traits; and a label long enough to fill a screen.
    for hidden in ["nightly\u{202E}1 kcab", "a\u{2028}b", "rack\u{200B}3"] {
        let (s, b) = api
            .post(
                "/api/v1/runs",
                admin,
                json!({"kind": "nccl", "nodes": ["env-second"], "label": hidden}),
            )
            .await;
        refused("run label", s, &b, "label");
        let (s, b) = api
            .post(
                "/api/v1/investigations",
                admin,
                json!({"kind": "nccl", "nodes": ["env-second"], "label": hidden}),
            )
            .await;
        refused("investigation label", s, &b, "label");
        let (s, b) = api
            .call(
                Method::PUT,
                "/api/v1/nodes/env-second/recommendations",
                Some(admin),
                Some(json!({"source": "manual", "items": [], "traits": {"rack": hidden}})),
            )
            .await;
        refused("trait value", s, &b, "trait");
    }
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "nccl", "nodes": ["env-second"], "label": "x".repeat(10_000)}),
        )
        .await;
    refused("a long run label", s, &b, "longer than 200");
}

/// Enough variables to make every test on the node fail to start: refused, saying where
/// they came from; each source under the limit, together over it: refused when the run
/// would start, naming each source's share.
async fn more_variables_than_a_test_starts_with_are_refused(api: &Api, admin: &str) {
    let many: serde_json::Map<String, serde_json::Value> = (0..300)
        .map(|i| (format!("NCCL_X{i}"), json!("1")))
        .collect();
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "nccl", "nodes": ["env-second"], "env": many}),
        )
        .await;
    refused("oversized run env", s, &b, "the run's env: 300");
    let (s, b) = api
        .post(
            "/api/v1/tuning-profiles",
            admin,
            json!({"name": "huge", "node": "env-second", "env": many}),
        )
        .await;
    refused("oversized tuning profile", s, &b, "300");
    // Each source under the limit, together over it: refused when the run would start,
    // naming each source's share.
    let profile: serde_json::Map<String, serde_json::Value> = (0..200)
        .map(|i| (format!("NCCL_P{i}"), json!("1")))
        .collect();
    let (s, b) = api
        .post(
            "/api/v1/tuning-profiles",
            admin,
            json!({"name": "big", "node": "env-second", "env": profile}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let run_env: serde_json::Map<String, serde_json::Value> = (0..100)
        .map(|i| (format!("NCCL_R{i}"), json!("1")))
        .collect();
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "nccl", "nodes": ["env-second"], "env": run_env}),
        )
        .await;
    refused("run under a big profile", s, &b, "run: 100");
    let (_, runs) = api.get("/api/v1/runs", admin).await;
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");
}

/// An agent's version is shown beside its node: a hostile agent's is refused at
/// enrollment and on heartbeats, and the node is not created.
async fn a_hostile_agent_version_is_refused(server: &TestServer, api: &Api, admin: &str) {
    let token = server.enrollment_token().await;
    let (s, b) = api
        .call(
            Method::POST,
            "/api/v1/agent/enroll",
            None,
            Some(json!({"enroll_token": token, "hostname": "env-third", "agent_version": "1.0\u{202E}0.9"})),
        )
        .await;
    refused("agent_version at enrollment", s, &b, "agent_version");
    let (s, _) = api.get("/api/v1/nodes/env-third", admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let agent = enroll(api, server, "env-fourth").await;
    let (s, b) = api
        .call(
            Method::POST,
            "/api/v1/agent/heartbeat",
            Some(&agent.credential),
            Some(json!({"agent_version": "x".repeat(5000)})),
        )
        .await;
    refused("agent_version on a heartbeat", s, &b, "agent_version");
}

/// Any language is still a label.
async fn any_language_is_a_label(api: &Api, admin: &str) {
    let (s, b) = api
        .post(
            "/api/v1/runs",
            admin,
            json!({"kind": "sleep", "params": {"seconds": 0.1}, "nodes": ["env-second"], "label": "nächtlich — 夜間 µs"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["label"], "nächtlich — 夜間 µs");
}

/// The label rule is for what people type: the server's own labels (an investigation's
/// pair runs are named by both host names, up to 253 bytes each) are not refused by it.
#[tokio::test]
async fn long_host_names_still_make_investigation_pairs() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let hosts: Vec<String> = ["a", "b"]
        .iter()
        .map(|s| format!("{s}{}", "x".repeat(149)))
        .collect();
    for h in &hosts {
        enroll(&api, &server, h).await;
    }
    let (s, b) = api
        .post(
            "/api/v1/investigations",
            &admin,
            json!({"kind": "nccl", "nodes": hosts}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (_, runs) = api.get("/api/v1/runs", &admin).await;
    let label = runs[0]["label"].as_str().unwrap();
    assert!(
        label.chars().count() > heddle_types::names::MAX_LABEL_CHARS,
        "{label}"
    );
}
