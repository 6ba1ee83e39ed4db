//! `/api/v1/jobs` and `/api/v1/jobs/{id}`, the first names of `/api/v1/workloads` and
//! `/api/v1/workloads/{id}`: the same status, headers and bytes for every request (pages,
//! refusals and unknown ids included), plus `Deprecation` (RFC 9745) and a `Link` to the
//! successor; the OpenAPI document marks them deprecated.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use heddle_server::testing::TestServer;
use heddle_server::testing::spool::{rank_file, upload};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// 2026-12-06T00:00:00Z in RFC 9745's form.
const DEPRECATED_AT: &str = "@1796515200";

struct Answer {
    status: StatusCode,
    next_cursor: Option<String>,
    deprecation: Option<String>,
    link: Option<String>,
    body: String,
}

async fn get(server: &TestServer, path: &str, token: Option<&str>) -> Answer {
    let mut req = server.client().get(format!("{}{path}", server.url));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    Answer {
        status: resp.status(),
        next_cursor: header("x-next-cursor"),
        deprecation: header("deprecation"),
        link: header("link"),
        body: resp.text().await.unwrap(),
    }
}

/// `old` answers what `new` answers, with the deprecation headers naming `successor`.
async fn same_answer(server: &TestServer, new: &str, old: &str, successor: &str) -> Answer {
    for token in [Some(server.admin_token.as_str()), None] {
        let a = get(server, new, token).await;
        let b = get(server, old, token).await;
        assert_eq!((a.status, &a.body), (b.status, &b.body), "{old} vs {new}");
        assert_eq!(a.next_cursor, b.next_cursor, "{old} vs {new}");
        assert_eq!((&a.deprecation, &a.link), (&None, &None), "{new}");
        assert_eq!(b.deprecation.as_deref(), Some(DEPRECATED_AT), "{old}");
        let link = format!("<{successor}>; rel=\"successor-version\"");
        assert_eq!(b.link.as_deref(), Some(link.as_str()), "{old}");
        if token.is_some() {
            return a;
        }
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{new} without a token");
    }
    unreachable!()
}

async fn enroll(server: &TestServer, hostname: &str) -> String {
    let token = server.enrollment_token().await;
    let resp = server
        .client()
        .post(format!("{}/api/v1/agent/enroll", server.url))
        .json(&json!({"enroll_token": token, "hostname": hostname, "agent_version": "test"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
    let body: Value = resp.json().await.unwrap();
    body["credential"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_jobs_paths_answer_as_the_workloads_paths_and_say_they_are_deprecated() {
    let server = TestServer::start().await;
    let credential = enroll(&server, "alias-1").await;
    let files = [
        rank_file("41", 1000, 100, 0, 9, true, 1),
        rank_file("42", 1000, 200, 0, 41, false, 20),
    ];
    let resp = server
        .client()
        .post(format!("{}/api/v1/agent/observations", server.url))
        .bearer_auth(&credential)
        .json(&upload(&files))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    let all = same_answer(
        &server,
        "/api/v1/workloads",
        "/api/v1/jobs",
        "/api/v1/workloads",
    )
    .await;
    let rows: Value = serde_json::from_str(&all.body).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "{rows}");

    // Filters, pages and their cursors are the same on both.
    let first = same_answer(
        &server,
        "/api/v1/workloads?node=alias-1&limit=1",
        "/api/v1/jobs?node=alias-1&limit=1",
        "/api/v1/workloads",
    )
    .await;
    let cursor = first.next_cursor.expect("a second page");
    let q = format!("?node=alias-1&limit=1&cursor={cursor}");
    let second = same_answer(
        &server,
        &format!("/api/v1/workloads{q}"),
        &format!("/api/v1/jobs{q}"),
        "/api/v1/workloads",
    )
    .await;
    assert_ne!(first.body, second.body);

    for id in rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
    {
        let one = same_answer(
            &server,
            &format!("/api/v1/workloads/{id}"),
            &format!("/api/v1/jobs/{id}"),
            &format!("/api/v1/workloads/{id}"),
        )
        .await;
        assert_eq!(one.status, StatusCode::OK, "{}", one.body);
        // The JSON keeps its field names.
        let body: Value = serde_json::from_str(&one.body).unwrap();
        assert!(body["job_key"].as_str().unwrap().starts_with("slurm:4"));
    }

    // Refusals are the same too, and still carry the headers.
    let nil = uuid::Uuid::nil();
    for (new, old, successor, status) in [
        (
            format!("/api/v1/workloads/{nil}"),
            format!("/api/v1/jobs/{nil}"),
            format!("/api/v1/workloads/{nil}"),
            StatusCode::NOT_FOUND,
        ),
        (
            "/api/v1/workloads?cursor=bogus".into(),
            "/api/v1/jobs?cursor=bogus".into(),
            "/api/v1/workloads".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/v1/workloads?nodes=alias-1".into(),
            "/api/v1/jobs?nodes=alias-1".into(),
            "/api/v1/workloads".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/api/v1/workloads/not-a-uuid".into(),
            "/api/v1/jobs/not-a-uuid".into(),
            "/api/v1/workloads/not-a-uuid".into(),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let refused = same_answer(&server, &new, &old, &successor).await;
        assert_eq!(refused.status, status, "{new}: {}", refused.body);
    }

    // The OpenAPI document: the old paths deprecated, the new ones not.
    let doc: Value = server
        .client()
        .get(format!("{}/api/v1/openapi.json", server.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op = |path: &str| &doc["paths"][path]["get"];
    for path in ["/api/v1/jobs", "/api/v1/jobs/{id}"] {
        assert_eq!(op(path)["deprecated"], true, "{path}: {}", op(path));
    }
    for path in ["/api/v1/workloads", "/api/v1/workloads/{id}"] {
        assert!(op(path).is_object(), "{path}");
        assert_ne!(op(path)["deprecated"], true, "{path}");
        assert_eq!(
            op(path)["parameters"],
            op(&path.replace("workloads", "jobs"))["parameters"]
        );
    }
    server.stop().await;
}
