//! The `heddle` binary against a real server serving HTTPS with a certificate from a
//! private CA made here: `--ca-file`, `--pin-sha256`, what `login` remembers of them, and
//! the errors when the CA is unknown or the key is not the pinned one.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (see `scripts/pg-ensure.sh`).

mod common;

use common::{heddle, run_heddle};
use heddle_server::testing::TestServer;
use heddle_tls::test_ca::TestCa;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_private_ca_and_pins() {
    let ca = TestCa::new();
    let files = ca.write_server_files("localhost");
    let server = TestServer::start_https(&files, |_| {}).await;
    let ca_file = files.ca.to_str().unwrap();
    let pin = files.issued.pin().to_string();

    let (code, out, err) = heddle(&server, &["--ca-file", ca_file, "whoami"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&server.url), "{out}");

    // The system's roots do not know the private CA.
    let (code, _, err) = heddle(&server, &["whoami"]);
    assert_eq!(code, 3, "a TLS failure is a transport error");
    assert!(
        err.contains("not signed by a CA this client trusts"),
        "{err}"
    );
    assert!(err.contains("--ca-file (HEDDLE_CA_FILE)"), "{err}");

    // Pinned: the server's own key passes, any other key is refused.
    let (code, _, err) = heddle(
        &server,
        &["whoami", "--ca-file", ca_file, "--pin-sha256", &pin],
    );
    assert_eq!(code, 0, "{err}");
    let other = ca.issue("localhost").pin().to_string();
    let (code, _, err) = heddle(
        &server,
        &["whoami", "--ca-file", ca_file, "--pin-sha256", &other],
    );
    assert_eq!(code, 3, "a TLS failure is a transport error");
    assert!(err.contains("not a pinned key"), "{err}");
    assert!(err.contains(&pin), "the error names the key found: {err}");
    // A rotation: either of two pins.
    let both = format!("{other},{pin}");
    let (code, _, err) = heddle(
        &server,
        &["whoami", "--ca-file", ca_file, "--pin-sha256", &both],
    );
    assert_eq!(code, 0, "{err}");

    // `login` keeps the CA and the pin for later commands against the same server.
    let config = std::env::temp_dir().join(format!("heddle-cli-{}.json", uuid::Uuid::new_v4()));
    let (code, _, err) = run_heddle(
        &server.url,
        &server.admin_token,
        &config,
        &["login", "--ca-file", ca_file, "--pin-sha256", &pin],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run_heddle(&server.url, &server.admin_token, &config, &["whoami"]);
    assert_eq!(code, 0, "{err}");
    // A pin given on the command line wins over the saved one.
    let (code, _, err) = run_heddle(
        &server.url,
        &server.admin_token,
        &config,
        &["whoami", "--pin-sha256", &other],
    );
    assert_eq!(code, 3, "a TLS failure is a transport error");
    assert!(err.contains("not a pinned key"), "{err}");
    let saved = std::fs::read_to_string(&config).unwrap();
    assert!(saved.contains(&pin) && saved.contains(ca_file), "{saved}");
    std::fs::remove_file(&config).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_still_works_and_refuses_a_pin() {
    let server = TestServer::start().await;
    assert!(server.url.starts_with("http://"));
    let (code, _, err) = heddle(&server, &["whoami"]);
    assert_eq!(code, 0, "{err}");
    let pin = TestCa::new().issue("localhost").pin().to_string();
    let (code, _, err) = heddle(&server, &["whoami", "--pin-sha256", &pin]);
    assert_eq!(code, 3, "a TLS failure is a transport error");
    assert!(err.contains("use https:// URLs"), "{err}");
}
