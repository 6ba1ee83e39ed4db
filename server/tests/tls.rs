//! The server serving HTTPS itself: the API over TLS, a renewed certificate served without a
//! restart (and a broken one not), clients refused for an unknown CA or a wrong pin, and a
//! start refused when the certificate cannot be read.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

use std::time::{Duration, Instant};

use heddle_server::testing::{TestDb, TestServer};
use heddle_server::{AppState, Config};
use heddle_tls::ClientTls;
use heddle_tls::test_ca::{ServerFiles, TestCa, write_atomically};

fn trusting(files: &ServerFiles, pins: Vec<heddle_tls::Pin>) -> reqwest::Client {
    let tls = ClientTls {
        ca_file: Some(files.ca.clone()),
        pins,
    };
    reqwest::Client::builder()
        .use_preconfigured_tls(tls.rustls_config().unwrap())
        .tls_info(true)
        // A new connection, hence a new handshake, for every request.
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// The certificate the server shows a new connection.
async fn served_certificate(server: &TestServer, files: &ServerFiles) -> Vec<u8> {
    let resp = trusting(files, vec![])
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("the server's certificate")
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let ca = TestCa::new();
    let mut files = ca.write_server_files("localhost");
    let server = TestServer::start_https(&files, |c| c.tls_reload_interval_s = 1).await;
    assert_eq!(
        served_certificate(&server, &files).await,
        files.issued.cert_der.to_vec()
    );
    // The API itself, with a token, over TLS.
    let resp = server
        .client()
        .get(format!("{}/api/v1/whoami", server.url))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Plain HTTP to the HTTPS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", server.addr))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");

    // A broken replacement is not taken: the old certificate stays in service.
    let old = files.issued.cert_der.to_vec();
    write_atomically(&files.cert, b"-----BEGIN CERTIFICATE-----\ngarbage\n");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(served_certificate(&server, &files).await, old);

    // A renewal with a new key is served within a few reload intervals.
    let old_pin = files.issued.pin();
    files.replace(ca.issue("localhost"));
    let new = files.issued.cert_der.to_vec();
    let start = Instant::now();
    loop {
        let served = served_certificate(&server, &files).await;
        if served == new {
            break;
        }
        assert_eq!(served, old, "neither the old nor the new certificate");
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the renewed certificate was not served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A client pinned to the new key connects; one pinned to the old key no longer does.
    let ok = trusting(&files, vec![files.issued.pin()])
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let refused = trusting(&files, vec![old_pin])
        .get(format!("{}/healthz", server.url))
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_refuse_an_unknown_ca_and_a_wrong_pin_with_a_remedy() {
    let ca = TestCa::new();
    let files = ca.write_server_files("localhost");
    let server = TestServer::start_https(&files, |_| {}).await;
    let url = format!("{}/healthz", server.url);

    // The system's roots alone.
    let err = reqwest::Client::new().get(&url).send().await.unwrap_err();
    let text = heddle_tls::describe(&err);
    assert!(text.contains("--ca-file (HEDDLE_CA_FILE)"), "{text}");

    // The right CA but another key pinned.
    let other = ca.issue("localhost").pin();
    let err = trusting(&files, vec![other])
        .get(&url)
        .send()
        .await
        .unwrap_err();
    let text = heddle_tls::describe(&err);
    assert!(text.contains("not a pinned key"), "{text}");
    assert!(text.contains(&files.issued.pin().to_string()), "{text}");

    // A certificate for another name than the URL's.
    let err = trusting(&files, vec![])
        .get(format!("https://127.0.0.1:{}/healthz", server.addr.port()))
        .send()
        .await
        .unwrap_err();
    let text = heddle_tls::describe(&err);
    assert!(text.contains("does not name the host"), "{text}");

    // The same certificate from another CA's point of view.
    let stranger = TestCa::new().write_server_files("localhost");
    let err = trusting(&stranger, vec![])
        .get(&url)
        .send()
        .await
        .unwrap_err();
    assert!(heddle_tls::describe(&err).contains("not signed by a CA"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_certificate_fails_the_start() {
    let ca = TestCa::new();
    let files = ca.write_server_files("localhost");
    let db = TestDb::create().await;
    let mut config = Config::for_database(&db.url);
    config.tls_cert = Some(files.dir.path().join("missing.crt"));
    config.tls_key = Some(files.key.clone());
    let state = AppState::new(config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        heddle_server::serve(listener, state.clone(), std::future::pending()),
    )
    .await
    .expect("serve returns at once");
    let err = format!("{:#}", result.unwrap_err());
    assert!(err.contains("missing.crt"), "{err}");
    state.db.close().await;
}

/// Log lines written while `serve` runs on `addr` for a moment, without TLS.
async fn plain_serving_log(db: &TestDb, addr: &str) -> String {
    use tracing::instrument::WithSubscriber;
    #[derive(Clone)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured(Default::default());
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let state = AppState::new(Config::for_database(&db.url)).await.unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let stop = tokio::time::sleep(Duration::from_millis(300));
    heddle_server::serve(listener, state.clone(), stop)
        .with_subscriber(subscriber)
        .await
        .unwrap();
    state.db.close().await;
    String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_beyond_loopback_is_warned_about() {
    let db = TestDb::create().await;
    let warning = "serving plain HTTP on a non-loopback address";
    let log = plain_serving_log(&db, "0.0.0.0:0").await;
    assert!(log.contains(warning) && log.contains("--tls-cert"), "{log}");
    let log = plain_serving_log(&db, "127.0.0.1:0").await;
    assert!(log.contains("serving"), "{log}");
    assert!(!log.contains(warning), "{log}");
}
