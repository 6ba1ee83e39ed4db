//! Attacks through a job's environment, against the real agent binary and a real server:
//! a job cannot choose which program runs as root (`PATH`), and nothing the agent keeps
//! secret reaches a test process.

mod lifecycle_support;

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use heddle_types::jobs::{JobState, Outcome};
use lifecycle_support::*;
use serde_json::json;

/// A `ucx_perftest` that records what it was given instead of testing anything.
fn fake_ucx_perftest(dir: &Path, script_body: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("ucx_perftest");
    std::fs::write(&path, format!("#!/bin/sh\n{script_body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

async fn finished_job(api: &Api, run: uuid::Uuid, agent: &Agent) -> heddle_types::jobs::Run {
    eventually(&format!("run {run} finished"), agent, || async {
        api.run(run).await.filter(|r| {
            matches!(
                r.jobs[0].state,
                JobState::Failed | JobState::Succeeded | JobState::Skipped
            )
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_run_with_path_env_cannot_run_a_script_as_root() {
    let server = server(1).await;
    let api = Api::new(&server);
    let tmp = tempfile::tempdir().unwrap();
    let evil = tmp.path().join("evil-bin");
    let marker = tmp.path().join("ran-as");
    fake_ucx_perftest(&evil, &format!("/usr/bin/id > {}", marker.display()));
    let state = tmp.path().join("state");
    let mut agent = enrolled_agent(&server, &state).await;

    // The API refuses it, naming the variable.
    let (status, body) = {
        let resp = api
            .http
            .post(format!("{}/api/v1/runs", server.url))
            .bearer_auth(&server.admin_token)
            .json(&json!({"kind": "ucx", "nodes": [HOST], "env": {"PATH": evil}}))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    };
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("PATH"), "{body}");

    // A job that reached the database some other way is refused by the agent itself.
    agent.sigkill();
    let run = start_run(
        &server,
        json!({"kind": "ucx", "env": {"UCX_TLS": "tcp"}, "timeout_s": 60}),
    )
    .await;
    sqlx::query("UPDATE runs SET spec = jsonb_set(spec, '{env}', $2) WHERE id = $1")
        .bind(run)
        .bind(json!({"PATH": evil, "UCX_TLS": "tcp"}))
        .execute(&server.state.db)
        .await
        .unwrap();
    // Jobs carry the environment fixed when the run was created: put it there too.
    sqlx::query(
        "UPDATE jobs SET applied_env = COALESCE(applied_env, '[]'::jsonb)
             || jsonb_build_array(jsonb_build_object('name', 'PATH', 'value', $2::text, 'source', 'run'))
         WHERE run_id = $1",
    )
    .bind(run)
    .bind(evil.display().to_string())
    .execute(&server.state.db)
    .await
    .unwrap();
    let agent = Agent::start(&[&server.url], None, &state);
    let done = finished_job(&api, run, &agent).await;
    assert!(
        !marker.exists(),
        "the job's ucx_perftest ran: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    let results = api.results(run).await;
    assert_eq!(done.jobs[0].state, JobState::Failed, "{results:?}");
    assert_eq!(results[0].outcome, Outcome::Failed);
    let reason = results[0].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("PATH") && reason.contains("refused"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_environment_holds_no_agent_secret() {
    let server = server(1).await;
    let api = Api::new(&server);
    let tmp = tempfile::tempdir().unwrap();
    let tools = tmp.path().join("tools");
    let dumps = tmp.path().join("dumps");
    std::fs::create_dir_all(&dumps).unwrap();
    // Installed by whoever runs the agent (first in the agent's own PATH): it dumps its
    // environment and its parent's (the test child), then fails.
    fake_ucx_perftest(
        &tools,
        &format!(
            "env > {d}/tool-$$\ntr '\\0' '\\n' < /proc/$PPID/environ > {d}/child-$$\necho fake >&2\nexit 1",
            d = dumps.display()
        ),
    );
    let enroll = server.enrollment_token().await;
    let state = tmp.path().join("state");
    let log = tmp.path().join("agent.log");
    // As under scripts/up.sh: the tokens are in the agent's own environment.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_heddle-agent"));
    cmd.arg("run")
        .args(["--server", &server.url])
        .args(["--state-dir", state.to_str().unwrap()])
        .args([
            "--hostname",
            HOST,
            "--claim-interval",
            "200ms",
            "--backoff-cap",
            "1s",
        ])
        .env("HEDDLE_ENROLL_TOKEN", &enroll)
        .env("HEDDLE_ADMIN_TOKEN", &server.admin_token)
        .env("HEDDLE_TOKEN", &server.admin_token)
        .env(
            "PATH",
            format!("{}:{}", tools.display(), std::env::var("PATH").unwrap()),
        )
        .env("HEDDLE_LOG", "info,heddle_agent=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap());
    let agent = Agent {
        child: cmd.spawn().unwrap(),
        log,
        state_dir: state.clone(),
    };
    eventually("node with facts", &agent, || async {
        api.fetch::<heddle_types::nodes::NodeDetail>(&format!("/nodes/{HOST}"))
            .await
            .filter(|n| n.facts.is_some())
    })
    .await;
    let credential = agent.identity()["credential"].as_str().unwrap().to_string();
    let run = start_run(
        &server,
        json!({"kind": "ucx", "params": {"tests": ["tag_lat"], "sizes": [8]}, "env": {"UCX_TLS": "tcp"}, "timeout_s": 60}),
    )
    .await;
    finished_job(&api, run, &agent).await;

    let secrets = [
        ("agent credential", credential.as_str()),
        ("enrollment token", enroll.as_str()),
        ("admin token", server.admin_token.as_str()),
    ];
    let mut seen = 0;
    for entry in std::fs::read_dir(&dumps).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("UCX_TLS=tcp"), "{}: {text}", path.display());
        for line in text.lines() {
            assert!(
                !line.starts_with("HEDDLE_") || line.starts_with("HEDDLE_NCCL_LIBRARY="),
                "{} holds {line}",
                path.display()
            );
        }
        for (what, secret) in secrets {
            assert!(
                !text.contains(secret),
                "{} holds the {what}",
                path.display()
            );
        }
        seen += 1;
    }
    // Both the test child and the tool it started were looked at.
    assert!(seen >= 2, "the fake ucx_perftest never ran");
}
