//! The site's fabric, against a real server and Postgres: each source is imported and read
//! back; a text that does not read is refused with 422 naming its lines, and nothing is
//! stored; bodies too large, control characters and writes by non-admins are refused.

mod common;

use common::{Api, error_code};
use heddle_server::testing::TestServer;
use heddle_types::auth::Role;
use heddle_types::fabric::stored::{StoredFabric, tree};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const TREE: &str = include_str!("../../types/tests/fixtures/fabric/slurm-topology-tree.conf");
const IBNET: &str =
    include_str!("../../types/tests/fixtures/fabric/ibnetdiscover-rdma-core-manual.txt");

async fn put(api: &Api, token: &str, body: Value) -> (StatusCode, Value) {
    api.call(Method::PUT, "/api/v1/fabric", Some(token), Some(body))
        .await
}

async fn stored(api: &Api, token: &str) -> StoredFabric {
    let (s, body) = api.get("/api/v1/fabric", token).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    serde_json::from_value(body).unwrap()
}

#[tokio::test]
async fn each_source_is_imported_and_read_back() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let viewer = server.token(Role::Viewer).await;

    let (s, body) = api.get("/api/v1/fabric", &viewer).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no fabric imported yet: heddle fabric import"),
        "{body}"
    );

    let (s, summary) = put(
        &api,
        &admin,
        json!({"source": "slurm-topology", "text": TREE}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{summary}");
    assert_eq!(
        (&summary["nodes"], &summary["switches"], &summary["links"]),
        (&json!(18), &json!(4), &json!(3)),
        "{summary}"
    );
    assert_eq!(summary["notes"], 18, "{summary}");
    assert_eq!(summary["source"], "slurm-topology");
    assert_eq!(summary["imported_by"], "token:admin-from-config");
    let got = stored(&api, &viewer).await;
    assert_eq!(got.fabric.nodes.len(), 18);
    let t = tree(&got.fabric);
    assert_eq!(
        (t[0].name.as_str(), &t[0].switches[..]),
        ("s3", &["s0", "s1", "s2"].map(String::from)[..])
    );
    let s2 = t.iter().find(|s| s.name == "s2").unwrap();
    assert_eq!(s2.nodes.first().map(String::as_str), Some("dev12"));
    assert_eq!(s2.nodes.len(), 6);

    let (s, summary) = put(
        &api,
        &admin,
        json!({"source": "ibnetdiscover", "text": IBNET}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{summary}");
    let got = stored(&api, &admin).await;
    assert_eq!(got.summary.source.as_str(), "ibnetdiscover");
    assert_eq!(
        got.fabric.switches.len() as u64,
        summary["switches"].as_u64().unwrap()
    );
    assert!(!got.fabric.switches.is_empty());

    let heddle = json!({
        "switches": [{"name": "leaf-0", "tier": "leaf"}, {"name": "spine-0", "tier": "spine"}],
        "links": [{"a": "leaf-0", "b": "spine-0", "gbps": 400}],
        "nodes": [{"name": "gpu-01", "nics": [{"name": "mlx5_0", "rail": 0, "leaf": "leaf-0", "gbps": 400}]}],
    });
    let (s, summary) = put(
        &api,
        &admin,
        json!({"source": "heddle", "text": heddle.to_string()}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{summary}");
    assert_eq!(
        (summary["nodes"].as_u64(), summary["notes"].as_u64()),
        (Some(1), Some(0))
    );
    let got = stored(&api, &viewer).await;
    assert_eq!(got.fabric.nodes[0].nics[0].gbps, Some(400.0));
    assert_eq!(got.summary.source.as_str(), "heddle");

    // Each import is in the audit log.
    let (s, log) = api.get("/api/v1/audit?limit=10", &admin).await;
    assert_eq!(s, StatusCode::OK, "{log}");
    let imports = log
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "fabric.import")
        .count();
    assert_eq!(imports, 3, "{log}");
}

#[tokio::test]
async fn bad_text_is_refused_with_its_lines_and_stores_nothing() {
    let server = TestServer::start_with(|c| c.max_fabric_bytes = 64 << 10).await;
    let api = Api::new(&server);
    let admin = server.admin_token.clone();
    let (s, _) = put(
        &api,
        &admin,
        json!({"source": "slurm-topology", "text": TREE}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let before = stored(&api, &admin).await;

    let garbage = "SwitchName=s0 Nodes=n[1-\nSwitchName=s1 Nodes=x Colour=red\nrm -rf /\n";
    let (s, body) = put(
        &api,
        &admin,
        json!({"source": "slurm-topology", "text": garbage}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(error_code(&body), "unprocessable");
    let message = body["message"].as_str().unwrap();
    for line in ["line 1:", "line 2: \"colour\" is not a key", "line 3:"] {
        assert!(message.contains(line), "{line}: {message}");
    }

    // The wrong reader for a text, and JSON that breaks the fabric's rules.
    let (s, body) = put(
        &api,
        &admin,
        json!({"source": "ibnetdiscover", "text": TREE}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let bad = json!({"nodes": [{"name": "n1", "nics": [{"name": "mlx5_0", "rail": 0, "leaf": "nowhere"}]}]});
    let (s, body) = put(
        &api,
        &admin,
        json!({"source": "heddle", "text": bad.to_string()}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("nodes[0].nics[0].leaf"),
        "{body}"
    );
    let (s, body) = put(&api, &admin, json!({"source": "cisco", "text": TREE})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // Control and invisible characters, a NUL byte among them, name their lines.
    let hostile = "SwitchName=s0 Nodes=n1\n# \u{0}\u{1b}[2J\nSwitchName=s1\u{202e} Nodes=n2\n";
    let (s, body) = put(
        &api,
        &admin,
        json!({"source": "slurm-topology", "text": hostile}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("line 2: holds the control") && message.contains("U+0000"),
        "{message}"
    );
    assert!(
        message.contains("line 3:") && message.contains("U+202E"),
        "{message}"
    );

    // A thousand bad lines give a bounded answer.
    let many = "Bogus\n".repeat(1000);
    let (s, body) = put(
        &api,
        &admin,
        json!({"source": "slurm-topology", "text": many}),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("and 900 more errors"), "{message}");
    assert!(message.len() < 20_000, "{} bytes", message.len());

    // A body over HEDDLE_MAX_FABRIC_BYTES.
    let big = format!("SwitchName=s0 Nodes=n1\n{}", "# padding\n".repeat(10_000));
    let (s, body) = put(
        &api,
        &admin,
        json!({"source": "slurm-topology", "text": big}),
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{body}");

    // None of it replaced the stored fabric.
    let after = stored(&api, &admin).await;
    assert_eq!(after, before);
}

#[tokio::test]
async fn only_admins_import() {
    let server = TestServer::start().await;
    let api = Api::new(&server);
    for role in [Role::Viewer, Role::Operator] {
        let token = server.token(role).await;
        let (s, body) = put(
            &api,
            &token,
            json!({"source": "slurm-topology", "text": TREE}),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{role}: {body}");
    }
    let (s, _) = api
        .call(
            Method::PUT,
            "/api/v1/fabric",
            None,
            Some(json!({"source": "slurm-topology", "text": TREE})),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _) = api.get("/api/v1/fabric", &server.admin_token).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}
