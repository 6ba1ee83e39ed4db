//! A fabric investigation through a real server, end to end: `heddle-loadgen --fabric`
//! imports a generated fat tree as the site's fabric, enrolls one simulated agent per node,
//! starts the investigation over the suspects and answers every test its agents claim from
//! the fabric model with one fault. The investigation must blame exactly that fault, in a
//! handful of rounds, and name it in the fabric's terms.
//!
//! Needs `HEDDLE_TEST_DATABASE_URL` (scripts/pg-ensure.sh) and heddle-server built with the
//! same profile.

use std::process::Command;

use serde_json::Value;

fn investigate(fault: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_heddle-loadgen"))
        .args([
            "--fabric",
            "--agents",
            "256",
            "--rails",
            "4",
            "--nodes-per-leaf",
            "16",
            "--suspects",
            "128",
            // Two seconds, not one: a node counts as online for 2.5 heartbeats, and with the
            // server, Postgres and 256 agents on two busy cores, one-second heartbeats left
            // a quarter of the nodes out as not seen (CI here, 97 % busy).
            "--heartbeat-s",
            "2",
            "--investigation-timeout-s",
            "400",
            "--json",
            "--fault",
            fault,
        ])
        .output()
        .expect("heddle-loadgen runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("{fault}: no report\nstdout: {stdout}\nstderr: {stderr}"));
    assert!(
        out.status.success(),
        "{fault}: {}\n{report:#}\nstderr: {stderr}",
        out.status
    );
    report
}

#[test]
fn a_fabric_investigation_through_a_real_server_blames_the_fault() {
    // A NIC whose tests hang, and a leaf that slows every test through it.
    for (fault, id, place) in [
        (
            "nic:n0042/mlx5_3:hang",
            "n0042/mlx5_3",
            "leaf-su2-r3 ↔ node n0042 NIC mlx5_3, rail 3",
        ),
        ("leaf:leaf-su5-r1", "leaf-su5-r1", "leaf switch leaf-su5-r1"),
    ] {
        let r = investigate(fault);
        assert_eq!(r["state"], "done", "{fault}: {r:#}");
        assert_eq!(r["faults_found"], true, "{fault}: {r:#}");
        let blamed = r["blamed"].as_array().unwrap();
        assert_eq!(blamed.len(), 1, "{fault}: {r:#}");
        assert_eq!(blamed[0]["id"], id, "{r:#}");
        let at = blamed[0]["place"].as_str().unwrap();
        assert!(at.starts_with(place), "{fault}: {at}");
        assert!(blamed[0]["confidence"].as_f64().unwrap() >= 0.95, "{r:#}");
        let rounds = r["rounds"].as_u64().unwrap();
        assert!((1..=10).contains(&rounds), "{fault}: {rounds} rounds");
        assert_eq!(
            r["failures"],
            serde_json::json!({}),
            "{fault}: requests failed: {r:#}"
        );
        // A node behind the blamed part says so in its health.
        let h = &r["health_reason"];
        let said = h["message"].as_str().unwrap_or_default();
        assert!(said.contains(id) || said.contains(place), "{fault}: {h:#}");
        // The node's own NIC fails it; a leaf it hangs off warns (its own tests may fail
        // it too: they ran through that leaf).
        let severity = if fault.starts_with("nic") {
            "fail"
        } else {
            "warn"
        };
        assert_eq!(h["severity"], severity, "{h:#}");
        assert!(
            matches!(h["verdict"].as_str(), Some("warn" | "fail")),
            "{h:#}"
        );
    }
}
