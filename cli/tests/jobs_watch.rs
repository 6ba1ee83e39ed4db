//! `heddle workloads watch` against a real server: a workload whose rank 1 (on another
//! node) never entered the collective its peer waits in is followed until it is flagged,
//! and the answer names the culprit; a finished one ends the watch by itself. `heddle jobs`,
//! the first name of `heddle workloads`, still answers the same and says it is deprecated.

mod common;

use common::{enroll, get, heddle};
use heddle_server::testing::TestServer;
use heddle_server::testing::spool::{rank_file, upload};
use serde_json::Value;

async fn observe(server: &TestServer, credential: &str, body: Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/agent/observations", server.url))
        .bearer_auth(credential)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

async fn workload_id(server: &TestServer, node: &str, key: &str) -> String {
    let jobs = get(server, &format!("/api/v1/workloads?node={node}")).await;
    jobs.as_array()
        .unwrap()
        .iter()
        .find(|j| j["job_key"] == key)
        .unwrap_or_else(|| panic!("no {key} on {node}: {jobs}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_follows_a_hung_job_until_it_is_flagged_and_a_finished_one_to_its_end() {
    let server = TestServer::start().await;
    let a = enroll(&server, "watch-a").await;
    let b = enroll(&server, "watch-b").await;
    // Slurm job 21: rank 0 on watch-a has waited 20 s in collective #41; rank 1 on watch-b
    // stopped after #40.
    observe(
        &server,
        &a,
        upload(&[rank_file("21", 1000, 100, 0, 41, false, 20)]),
    )
    .await;
    observe(
        &server,
        &b,
        upload(&[rank_file("21", 1000, 200, 1, 40, true, 21)]),
    )
    .await;
    let id = workload_id(&server, "watch-a", "slurm:21").await;

    let server_url = server.url.clone();
    let token = server.admin_token.clone();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        common::heddle_as(
            &server_url,
            &token,
            &[
                "workloads",
                "watch",
                &id,
                "--interval",
                "1",
                "--until-flagged",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "a hung job is FAIL: {out}{err}");
    assert!(out.contains("job-hung"), "{out}");
    assert!(out.contains("<- culprit"), "{out}");
    let culprit = out.lines().find(|l| l.contains("<- culprit")).unwrap();
    assert!(culprit.contains("watch-b"), "the culprit's node: {culprit}");

    // Slurm job 22 on watch-a alone, finished: the watch ends with its verdict, and
    // `--json` gives one object a line.
    let mut done = rank_file("22", 1000, 300, 0, 9, true, 1);
    done.is_final = true;
    done.comms[0].nranks = 1;
    done.comms[0].nnodes = 1;
    done.comms[0].finalized_at = Some(chrono::Utc::now());
    observe(&server, &a, upload(&[done])).await;
    let id = workload_id(&server, "watch-a", "slurm:22").await;
    let (code, out, err) = heddle(&server, &["--json", "workloads", "watch", &id]);
    assert!(code == 0 || code == 7, "{code}: {out}{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["finished"], true, "{out}");

    // `heddle jobs` is the same command under its first name, with one line on stderr.
    let (old_code, old_out, old_err) = heddle(&server, &["--json", "jobs", "watch", &id]);
    assert_eq!(
        (old_code, old_out.as_str()),
        (code, out.as_str()),
        "{old_err}"
    );
    assert!(
        old_err
            .ends_with("heddle jobs is deprecated: use heddle workloads (the same subcommands)\n"),
        "{old_err}"
    );
    let (code, ls, err) = heddle(&server, &["--json", "workloads", "ls", "--node", "watch-a"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("deprecated"), "{err}");
    let (code, old_ls, old_err) = heddle(&server, &["--json", "jobs", "ls", "--node", "watch-a"]);
    assert_eq!((code, old_ls.as_str()), (0, ls.as_str()), "{old_err}");
    assert!(old_err.contains("use heddle workloads"), "{old_err}");

    // An unknown workload is a usage error (404), not a loop.
    let (code, _, err) = heddle(
        &server,
        &["workloads", "watch", "00000000-0000-0000-0000-000000000000"],
    );
    assert_eq!(code, 5, "{err}");
    server.stop().await;
}
