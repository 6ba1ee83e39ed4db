//! Limits at the door, each tested by overrunning it against a real server: JSON nesting,
//! rates per credential, long polls, request timeouts, the metrics token and the
//! dashboard's Content-Security-Policy.

mod common;

use std::time::{Duration, Instant};

use common::*;
use heddle_server::testing::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::json;

fn nested(depth: usize) -> String {
    format!(
        r#"{{"kernel": {{"release": "6.8"}}, "deep": {}1{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[tokio::test]
async fn deep_json_body_is_refused_with_422() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let agent = enroll(&api, &server, "deep-1").await;
    // Deeper than the cap but within serde_json's own limit (128): once stored as facts.
    for depth in [100, 100_000] {
        let (s, b) = api
            .raw(
                Method::PUT,
                "/api/v1/agent/facts",
                Some(&agent.credential),
                "application/json",
                nested(depth).into_bytes(),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "depth {depth}: {b}");
        assert!(
            b["message"].as_str().unwrap().contains("deeper than 64"),
            "{b}"
        );
    }
    let (s, b) = api
        .raw(
            Method::PUT,
            "/api/v1/agent/facts",
            Some(&agent.credential),
            "application/json",
            nested(10).into_bytes(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "ordinary nesting is fine: {b}");
    // Same door for people's endpoints.
    let (s, _) = api
        .raw(
            Method::POST,
            "/api/v1/runs",
            Some(&server.admin_token),
            "application/json",
            format!(
                r#"{{"kind": "sleep", "params": {}{}}}"#,
                "{\"a\":".repeat(80),
                "1}".repeat(80)
            )
            .into_bytes(),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn rate_limit_answers_429() {
    let server = TestServer::start_with(|c| {
        c.rate_limit_per_s = 2;
        c.rate_limit_burst = 5;
    })
    .await;
    let api = Api::new(&server);
    let hammer = server.token(heddle_types::auth::Role::Viewer).await;
    let mut limited = None;
    for _ in 0..20 {
        let resp = api
            .http
            .get(format!("{}/api/v1/whoami", server.url))
            .bearer_auth(&hammer)
            .send()
            .await
            .unwrap();
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(resp);
            break;
        }
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let resp = limited.expect("20 requests at once with a burst of 5 were all served");
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(error_code(&body), "rate_limited");
    // Another credential is not slowed down by this one.
    let (s, _) = api.get("/api/v1/whoami", &server.admin_token).await;
    assert_eq!(s, StatusCode::OK);
    // And the hammering one recovers.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(api.get("/api/v1/whoami", &hammer).await.0, StatusCode::OK);
}

#[tokio::test]
async fn long_polls_beyond_the_cap_get_503() {
    let server = TestServer::start_with(|c| c.max_long_polls = 1).await;
    let api = Api::new(&server);
    let r0 = enroll(&api, &server, "poll-0").await;
    let r1 = enroll(&api, &server, "poll-1").await;
    let run = server
        .start_run(
            json!({"kind": "sleep", "params": {"seconds": 60}, "nodes": ["poll-0", "poll-1"]}),
        )
        .await;
    let path = format!(
        "/api/v1/agent/rendezvous/{}/nccl-id?timeout_ms=3000",
        run.id
    );
    let waiting = {
        let api = Api::new(&server);
        let path = path.clone();
        let cred = r1.credential.clone();
        tokio::spawn(async move { api.get(&path, &cred).await.0 })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    let resp = api
        .http
        .get(format!("{}{path}", server.url))
        .bearer_auth(&r0.credential)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(start.elapsed() < Duration::from_secs(1), "answered at once");
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(error_code(&body), "busy");
    assert_eq!(waiting.await.unwrap(), StatusCode::REQUEST_TIMEOUT);
    // The slot is free again.
    let (s, _) = api
        .get(
            &format!("/api/v1/agent/rendezvous/{}/nccl-id?timeout_ms=100", run.id),
            &r0.credential,
        )
        .await;
    assert_eq!(s, StatusCode::REQUEST_TIMEOUT);
}

#[tokio::test]
async fn slow_body_is_cut_by_the_request_timeout() {
    let server = TestServer::start_with(|c| c.request_timeout_s = 1).await;
    // A body that trickles in one byte every 300 ms, never finishing within the limit.
    let body = futures::stream::unfold(0u8, |n| async move {
        if n >= 20 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        Some((Ok::<_, std::io::Error>(vec![b' ']), n + 1))
    });
    let start = Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("{}/api/v1/runs", server.url))
        .bearer_auth(&server.admin_token)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(error_code(&body), "request_timeout");
}

#[tokio::test]
async fn metrics_require_token_when_configured() {
    let server = TestServer::start_with(|c| c.metrics_token = Some("scrape-secret".into())).await;
    let api = Api::new(&server);
    let (s, b) = api.call(Method::GET, "/metrics", None, None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("HEDDLE_METRICS_TOKEN")
    );
    let (s, _) = api.get("/metrics", "wrong").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Not even the admin token: scrapers get their own.
    let (s, _) = api.get("/metrics", &server.admin_token).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, b) = api.get("/metrics", "scrape-secret").await;
    assert_eq!(s, StatusCode::OK);
    assert!(b.as_str().unwrap().contains("heddle_agents_online"));
    // Health checks stay open.
    assert_eq!(
        api.call(Method::GET, "/healthz", None, None).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn dashboard_sends_csp() {
    let dir = tempfile::tempdir().unwrap();
    let boot = "\nimport init from '/heddle_frontend.js';\ninit();\n";
    std::fs::write(
        dir.path().join("index.html"),
        format!("<!doctype html><html><body><script type=\"module\">{boot}</script></body></html>"),
    )
    .unwrap();
    let dashboard = dir.path().to_path_buf();
    let server = TestServer::start_with(|c| c.dashboard_dir = Some(dashboard)).await;
    for path in ["/", "/nodes/some-node", "/index.html"] {
        let resp = reqwest::get(format!("{}{path}", server.url)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let csp = resp.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        let script_src = csp
            .split(';')
            .find(|d| d.trim_start().starts_with("script-src"))
            .unwrap_or_else(|| panic!("no script-src in {csp}"));
        assert!(!script_src.contains("unsafe-inline"), "{csp}");
        assert!(!script_src.contains(" 'unsafe-eval'"), "{csp}");
        use base64::Engine;
        use sha2::Digest;
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(boot));
        assert!(script_src.contains(&format!("'sha256-{hash}'")), "{csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        assert_eq!(resp.headers()["x-content-type-options"], "nosniff");
    }
    // The status page without a dashboard has one too.
    let bare = TestServer::start().await;
    let resp = reqwest::get(&bare.url).await.unwrap();
    assert!(
        resp.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'none'")
    );
}

/// Reads one HTTP/1.1 response (headers and a `content-length` body) from `conn`; `None`
/// when the server closed the connection first.
async fn read_response(conn: &mut tokio::net::TcpStream) -> Option<(u16, String)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                return Some((status, head));
            }
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An answer given before the handler reads the body — a NUL in the path, an unknown
/// credential — must not cost the client its keep-alive connection when the body arrives
/// after the headers (as from any client that writes them separately): the next request
/// on that connection is answered too.
#[tokio::test]
async fn early_answers_keep_the_connection_when_the_body_comes_late() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start().await;
    let addr = server.url.trim_start_matches("http://").to_string();
    let body = r#"{"blob_b64": "AAAA"}"#;
    let early = [
        (
            "PUT /api/v1/agent/rendezvous/00000000-0000-0000-0000-000000000000/a%00b",
            "Bearer hda_nobody",
            400,
        ),
        ("POST /api/v1/agent/heartbeat", "Bearer hda_nobody", 401),
    ];
    for (line, auth, status) in early {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        conn.set_nodelay(true).unwrap();
        let head = format!(
            "{line} HTTP/1.1\r\nhost: heddle\r\nauthorization: {auth}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        conn.write_all(body.as_bytes()).await.unwrap();
        let (got, head) = read_response(&mut conn).await.expect("an answer");
        assert_eq!(got, status, "{line}: {head}");
        assert!(!head.contains("connection: close"), "{line}: {head}");
        let sent = conn
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: heddle\r\n\r\n")
            .await;
        let next = match sent {
            Ok(()) => read_response(&mut conn).await,
            Err(_) => None,
        };
        assert_eq!(
            next.map(|r| r.0),
            Some(200),
            "{line}: the connection was dropped after the early answer"
        );
    }
}
