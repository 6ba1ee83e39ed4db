//! `schema/facts.schema.json` is generated from the wire types; this test fails when the
//! checked-in file no longer matches them.

use std::path::PathBuf;

use heddle_types::facts::NodeFacts;

const REGENERATE: &str = "HEDDLE_UPDATE_SCHEMA=1 cargo test -p heddle-agent --test facts_schema";

fn generated() -> String {
    let schema = schemars::schema_for!(NodeFacts);
    serde_json::to_string_pretty(&schema).expect("schema serializes") + "\n"
}

#[test]
fn checked_in_schema_is_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schema/facts.schema.json");
    let fresh = generated();
    if std::env::var_os("HEDDLE_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &fresh).expect("write schema");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; create it with `{REGENERATE}`",
            path.display()
        )
    });
    assert!(
        on_disk == fresh,
        "{} is stale: the facts types changed. Regenerate it with `{REGENERATE}` and commit the result.",
        path.display()
    );
}

#[test]
fn schema_names_the_server_filter_paths() {
    let schema: serde_json::Value = serde_json::from_str(&generated()).unwrap();
    let required = schema["required"].as_array().unwrap();
    for field in ["schema_version", "collected_at", "host", "gpus", "rdma"] {
        assert!(
            required.iter().any(|r| r == field) || schema["properties"].get(field).is_some(),
            "{field} missing"
        );
    }
    let defs = &schema["$defs"];
    assert!(defs["HostFacts"]["properties"]["hostname"].is_object());
    assert!(defs["RdmaPort"]["properties"]["state"].is_object());
    assert!(defs["RdmaPort"]["properties"]["link_layer"].is_object());
    assert!(defs["GpuFacts"]["properties"]["name"].is_object());
}
