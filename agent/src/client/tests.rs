//! Tests of `client`.

use super::*;

#[test]
fn urls_are_validated_and_trimmed() {
    let c = Client::new(&["http://a:1/".into(), " ".into(), "http://b:2".into()]).unwrap();
    assert_eq!(c.servers, vec!["http://a:1", "http://b:2"]);
    assert!(matches!(
        Client::new(&["ftp://a".into()]),
        Err(ClientError::BadUrl { .. })
    ));
    assert!(matches!(Client::new(&[]), Err(ClientError::BadUrl { .. })));
}

#[test]
fn rendezvous_names_are_restricted() {
    assert!(check_name("nccl-id.0").is_ok());
    assert!(check_name("../etc").is_err());
    assert!(check_name("a b").is_err());
    assert!(check_name("").is_err());
}

#[tokio::test]
async fn fails_over_to_a_live_replica() {
    // A replica that refuses connections, then one that answers 204 to a claim.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let live_url = format!("http://{}", live.local_addr().unwrap());
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut sock, _) = live.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = sock.read(&mut buf).await.unwrap();
        let req = String::from_utf8_lossy(&buf[..n]).into_owned();
        sock.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        req
    });
    let client = Client::new(&[dead_url.clone(), live_url.clone()]).unwrap();
    client.set_credential("secret".into());
    assert!(client.claim().await.unwrap().is_none());
    assert_eq!(client.current_server(), live_url);
    let req = server.await.unwrap();
    assert!(req.starts_with("POST /api/v1/agent/jobs/claim "), "{req}");
    assert!(
        req.to_lowercase().contains("authorization: bearer secret"),
        "{req}"
    );
}

#[tokio::test]
async fn a_hung_replica_is_left_for_the_next() {
    // Accepts connections, never answers.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_url = format!("http://{}", hung.local_addr().unwrap());
    let _holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = hung.accept().await {
            held.push(sock);
        }
    });
    let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let live_url = format!("http://{}", live.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut sock, _) = live.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = sock.read(&mut buf).await.unwrap();
        sock.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
    });
    let client = Client::new(&[hung_url, live_url.clone()])
        .unwrap()
        .with_request_timeout(Duration::from_millis(300));
    let start = std::time::Instant::now();
    assert!(client.claim().await.unwrap().is_none());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(client.current_server(), live_url);
}

#[test]
fn retry_after_takes_seconds_and_is_capped() {
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
    let with = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
        retry_after(&h)
    };
    assert_eq!(with("1"), Some(Duration::from_secs(1)));
    assert_eq!(with(" 7 "), Some(Duration::from_secs(7)));
    assert_eq!(with("999999999"), Some(MAX_RETRY_AFTER));
    assert_eq!(with("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    assert_eq!(with("-1"), None);
    assert_eq!(retry_after(&HeaderMap::new()), None);
}

/// Two replicas answer 503 (their database is down); the client reports one
/// transient error carrying the longest Retry-After.
#[tokio::test]
async fn a_503_everywhere_is_transient_and_carries_retry_after() {
    let mut urls = Vec::new();
    for secs in [2, 5] {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!("http://{}", l.local_addr().unwrap()));
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut sock, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = sock.read(&mut buf).await.unwrap();
            let body =
                r#"{"error":"unavailable","message":"the database is unavailable; retry later"}"#;
            let resp = format!(
                "HTTP/1.1 503 Service Unavailable\r\nretry-after: {secs}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(resp.as_bytes()).await.unwrap();
        });
    }
    let client = Client::new(&urls).unwrap();
    client.set_credential("secret".into());
    let err = client.claim().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(err.status(), Some(503));
    assert_eq!(err.retry_after(), Some(Duration::from_secs(5)));
    assert!(err.to_string().contains("database is unavailable"), "{err}");
}

#[tokio::test]
async fn unreachable_everywhere_is_transient() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let client = Client::new(&[url]).unwrap();
    let err = client.claim().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(matches!(err, ClientError::Unreachable { .. }));
}
