//! `heddle investigate simulate` against the real `heddle-fabric-oracle`, and against
//! oracles that break the protocol.

use std::process::Command;

use serde_json::Value;

fn fabric_file(nodes: usize) -> std::path::PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_heddle-fabric-oracle"))
        .args(["topology", "--nodes", &nodes.to_string(), "--rails", "8"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = std::env::temp_dir().join(format!("heddle-fabric-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

fn simulate(topology: &std::path::Path, suspects: &str, oracle: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_heddle"))
        .args([
            "investigate",
            "simulate",
            "--json",
            "--suspects",
            suspects,
            "--oracle",
            oracle,
        ])
        .arg("--topology")
        .arg(topology)
        // No server is needed, nor asked for.
        .env("HEDDLE_URL", "http://127.0.0.1:9")
        .output()
        .unwrap()
}

#[test]
fn the_simulator_names_a_bad_nic_through_the_oracle() {
    let topology = fabric_file(256);
    let oracle = format!(
        "{} serve --topology {} --fault nic:n0042/mlx5_3 --seed 4",
        env!("CARGO_BIN_EXE_heddle-fabric-oracle"),
        topology.display()
    );
    let out = simulate(&topology, "n[0001-0128]", &oracle);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(answer["blamed"].as_array().unwrap().len(), 1, "{answer:#}");
    assert_eq!(answer["blamed"][0]["component"], "nic");
    assert_eq!(answer["blamed"][0]["id"], "n0042/mlx5_3");
    assert!(answer["blamed"][0]["confidence"].as_f64().unwrap() >= 0.95);
    assert!(answer["rounds"].as_u64().unwrap() <= 10);
    assert!(answer["node_seconds"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_file(topology);
}

#[test]
fn oracles_that_break_the_protocol_are_named() {
    let topology = fabric_file(64);
    for (oracle, want) in [
        ("true", "ended before answering round 1"),
        ("echo nope", "is not results"),
        ("echo '{\"round\": 1, \"results\": []}'", "no result"),
    ] {
        let out = simulate(&topology, "n[0001-0016]", oracle);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{oracle}");
        assert!(stderr.contains(want), "{oracle}: {stderr}");
    }
    let out = simulate(&topology, "x[1-2]", "true");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no suspect is a node"));
    let _ = std::fs::remove_file(topology);
}
