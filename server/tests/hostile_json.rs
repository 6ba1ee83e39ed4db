//! JSON bodies with odd encodings at the server's door, against a real server: a byte
//! order mark, bytes that are not UTF-8, lone surrogates (escaped and raw), NUL, numbers
//! past every integer and float, deep nesting, trailing bytes, other encodings, and
//! mutations of real bodies. Whatever arrives, the answer is a 2xx or a clean 4xx with the
//! API's `{error, message}` body: never a 5xx, never a dropped connection. Cases per
//! property: 128 unless `PROPTEST_CASES` says otherwise.

mod common;

use common::*;
use heddle_server::testing::TestServer;
use heddle_testkit::props;
use proptest::prelude::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// One endpoint that takes a JSON body, and a body it accepts.
struct Door {
    method: Method,
    path: &'static str,
    token: Option<String>,
    body: Vec<u8>,
}

/// The doors of each kind: unauthenticated (enrollment), an agent's, and a person's.
async fn doors(server: &TestServer, api: &Api) -> Vec<Door> {
    let agent = enroll(api, server, "odd-json-1").await;
    let enroll_token = server.enrollment_token().await;
    vec![
        Door {
            method: Method::POST,
            path: "/api/v1/agent/enroll",
            token: None,
            body: json!({"enroll_token": enroll_token, "hostname": "odd-json-2", "agent_version": "t"})
                .to_string()
                .into_bytes(),
        },
        Door {
            method: Method::PUT,
            path: "/api/v1/agent/facts",
            token: Some(agent.credential.clone()),
            body: fixture_facts("runai-roce").to_string().into_bytes(),
        },
        Door {
            method: Method::POST,
            path: "/api/v1/agent/heartbeat",
            token: Some(agent.credential.clone()),
            body: json!({"agent_version": "t", "running_jobs": []}).to_string().into_bytes(),
        },
        Door {
            method: Method::POST,
            path: "/api/v1/runs",
            token: Some(server.admin_token.clone()),
            body: json!({"kind": "sleep", "params": {"seconds": 1}, "nodes": ["odd-json-1"], "label": "x", "timeout_s": 60})
                .to_string()
                .into_bytes(),
        },
    ]
}

/// Bodies that break JSON readers, each with what it is.
fn odd_bodies(valid: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let valid = String::from_utf8(valid.to_vec()).unwrap();
    // A string value of the body with `text` inserted into it.
    let in_string = |text: &[u8]| -> Vec<u8> {
        let at = valid.find("\":\"").map_or(0, |i| i + 3);
        let mut b = valid.as_bytes()[..at].to_vec();
        b.extend_from_slice(text);
        b.extend_from_slice(&valid.as_bytes()[at..]);
        b
    };
    // The first number of the body (or the first value) replaced by `n`.
    let as_number = |n: &str| -> Vec<u8> {
        let i = valid.find(|c: char| c.is_ascii_digit()).unwrap_or(0);
        let end = valid[i..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(valid.len(), |e| i + e);
        format!("{}{n}{}", &valid[..i], &valid[end..]).into_bytes()
    };
    let mut with_bom = b"\xef\xbb\xbf".to_vec();
    with_bom.extend_from_slice(valid.as_bytes());
    let utf16: Vec<u8> = valid.encode_utf16().flat_map(u16::to_le_bytes).collect();
    vec![
        ("a byte order mark", with_bom),
        ("UTF-16", utf16),
        ("a byte that is not UTF-8", in_string(b"a\xffb")),
        ("a raw surrogate (CESU-8)", in_string(b"\xed\xa0\x80")),
        ("an overlong NUL", in_string(b"\xc0\x80")),
        ("a lone high surrogate", in_string(br"\ud800")),
        ("a lone low surrogate", in_string(br"\udc00")),
        ("surrogates in the wrong order", in_string(br"\udc00\ud800")),
        ("an escaped NUL", in_string(br"\u0000")),
        ("a raw NUL", in_string(b"\0")),
        ("an escape that is not one", in_string(br"\x41")),
        ("a bidirectional override", in_string("\u{202e}".as_bytes())),
        ("a number past u64", as_number("18446744073709551616")),
        ("a number below i64", as_number("-9223372036854775809")),
        ("a float past f64", as_number("1e400")),
        ("a thousand-digit number", as_number(&"9".repeat(1000))),
        ("a negative count", as_number("-1")),
        ("a fraction", as_number("0.5")),
        ("NaN", as_number("NaN")),
        (
            "deep arrays",
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
        ),
        (
            "deep objects",
            format!("{}1{}", "{\"a\":".repeat(65), "}".repeat(65)).into_bytes(),
        ),
        ("trailing bytes", format!("{valid}x").into_bytes()),
        ("two documents", format!("{valid}{valid}").into_bytes()),
        (
            "a duplicated key",
            valid
                .replacen('{', "{\"kind\":1,\"kind\":2,", 1)
                .into_bytes(),
        ),
        ("nothing", Vec::new()),
        ("null", b"null".to_vec()),
        ("an array", b"[]".to_vec()),
        ("a string", b"\"x\"".to_vec()),
        ("a cut body", valid.as_bytes()[..valid.len() / 2].to_vec()),
        (
            "a body past the limit",
            format!("{{\"a\":\"{}\"}}", "x".repeat(2 << 20)).into_bytes(),
        ),
    ]
}

/// A clean answer: 2xx, or 4xx with `{error, message}`.
fn clean(status: StatusCode, body: &Value) -> Result<(), String> {
    if status.is_success() {
        return Ok(());
    }
    if !status.is_client_error() {
        return Err(format!("{status}: {body}"));
    }
    match (body["error"].as_str(), body["message"].as_str()) {
        (Some(_), Some(_)) => Ok(()),
        _ => Err(format!("{status} without the API's error body: {body}")),
    }
}

async fn send(api: &Api, door: &Door, body: Vec<u8>) -> (StatusCode, Value) {
    api.raw(
        door.method.clone(),
        door.path,
        door.token.as_deref(),
        "application/json",
        body,
    )
    .await
}

async fn server() -> TestServer {
    TestServer::start_with(|c| {
        // Every case here comes from one credential; the rate limit is tested elsewhere.
        c.rate_limit_per_s = 100_000;
        c.rate_limit_burst = 100_000;
    })
    .await
}

#[tokio::test]
async fn odd_encodings_get_a_clean_4xx() {
    let server = server().await;
    let api = Api::new(&server);
    for door in doors(&server, &api).await {
        let (s, b) = send(&api, &door, door.body.clone()).await;
        assert!(
            s.is_success(),
            "{} {}: the valid body: {s} {b}",
            door.method,
            door.path
        );
        for (what, body) in odd_bodies(&door.body) {
            let (s, b) = send(&api, &door, body).await;
            clean(s, &b)
                .unwrap_or_else(|e| panic!("{} {} with {what}: {e}", door.method, door.path));
        }
    }
    // The server still answers.
    let (s, _) = api.get("/api/v1/nodes", &server.admin_token).await;
    assert_eq!(s, StatusCode::OK);
}

#[test]
fn mutated_bodies_get_a_clean_answer() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(server());
    let api = Api::new(&server);
    for door in rt.block_on(doors(&server, &api)) {
        let mut runner = proptest::test_runner::TestRunner::new(props::config(128));
        runner
            .run(&props::mutated_json(door.body.clone()), |body| {
                let (s, b) = rt.block_on(send(&api, &door, body));
                clean(s, &b).map_err(TestCaseError::fail)
            })
            .unwrap_or_else(|e| panic!("{} {}: {e}", door.method, door.path));
    }
}
