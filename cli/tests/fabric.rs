//! `heddle fabric import` and `show` against a real server: each source, the tree people
//! read, and the exit codes of a refused file, a missing one and a non-admin.

mod common;

use common::{heddle, heddle_as};
use heddle_server::testing::TestServer;
use heddle_types::auth::Role;
use heddle_types::fabric::stored::{FabricSummary, StoredFabric};

const TREE: &str = "../types/tests/fixtures/fabric/slurm-topology-tree.conf";
const IBNET: &str = "../types/tests/fixtures/fabric/ibnetdiscover-ompi-users-2009.txt";

#[tokio::test(flavor = "multi_thread")]
async fn import_and_show() {
    let server = TestServer::start().await;

    let (code, out, err) = heddle(&server, &["fabric", "show"]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(err.contains("no fabric imported yet"), "{err}");

    let (code, out, err) = heddle(&server, &["fabric", "import", "--slurm-topology", TREE]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("18 nodes, 4 switches, 3 links, 18 notes"),
        "{out}"
    );

    let (code, out, err) = heddle(&server, &["fabric", "show"]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "from slurm-topology",
        "s[0-2]",
        "dev[0-5]",
        "dev[12-17]",
        "dev[0-17]",
        "NICs unmapped",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let (code, out, err) = heddle(&server, &["fabric", "show", "--json"]);
    assert_eq!(code, 0, "{err}");
    let stored: StoredFabric = serde_json::from_str(&out).unwrap();
    assert_eq!(stored.fabric.nodes.len(), 18);

    let (code, out, err) = heddle(
        &server,
        &["fabric", "import", "--ibnetdiscover", IBNET, "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let summary: FabricSummary = serde_json::from_str(&out).unwrap();
    assert_eq!(summary.source.as_str(), "ibnetdiscover");
    assert!(summary.switches > 0 && summary.nodes > 0, "{summary:?}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fabric.json");
    std::fs::write(
        &file,
        r#"{"switches": [{"name": "leaf-0", "tier": "leaf"}], "nodes": [{"name": "gpu-01", "nics": [{"name": "mlx5_0", "rail": 0, "leaf": "leaf-0"}]}]}"#,
    )
    .unwrap();
    let (code, out, err) = heddle(
        &server,
        &["fabric", "import", "--file", file.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("1 nodes, 1 switches, 0 links, 0 notes"),
        "{out}"
    );

    // A file that does not read: exit 5, the server's lines on stderr, nothing replaced.
    let bad = dir.path().join("topology.conf");
    std::fs::write(&bad, "SwitchName=s0 Nodes=n1\nSwitchName=s1 Colour=red\n").unwrap();
    let (code, _, err) = heddle(
        &server,
        &[
            "fabric",
            "import",
            "--slurm-topology",
            bad.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("line 2: \"colour\" is not a key"), "{err}");
    let (code, _, err) = heddle(
        &server,
        &[
            "fabric",
            "import",
            "--slurm-topology",
            "/nonexistent/topology.conf",
        ],
    );
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("cannot read /nonexistent/topology.conf"),
        "{err}"
    );
    let (code, _, err) = heddle(
        &server,
        &["fabric", "import", "--slurm-topology", TREE, "--file", TREE],
    );
    assert_eq!(code, 5, "{err}");

    // Viewers read; only admins import (exit 4).
    let viewer = server.token(Role::Viewer).await;
    let (code, out, err) = heddle_as(&server.url, &viewer, &["fabric", "show"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gpu-01"), "{out}");
    let (code, _, err) = heddle_as(
        &server.url,
        &viewer,
        &["fabric", "import", "--slurm-topology", TREE],
    );
    assert_eq!(code, 4, "{err}");
}
