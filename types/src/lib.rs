//! Wire types shared by every Heddle component.
//!
//! This crate owns the JSON shapes that cross a process boundary: the REST API, the agent
//! protocol and the node facts. It does no I/O so the dashboard (wasm) can depend on it.
//! With the `openapi` feature the types also derive `utoipa::ToSchema`, which is how the
//! server's OpenAPI document describes them.

pub mod agent;
pub mod auth;
pub mod collective;
pub mod conditions;
pub mod duration;
pub mod env_input;
pub mod env_policy;
pub mod error;
pub mod fabric;
pub mod facts;
pub mod health;
pub mod hostlist;
pub mod investigations;
pub mod jobs;
pub mod kinds;
pub mod must_agree;
pub mod names;
pub mod nccl_conf;
pub mod node_checks;
pub mod nodes;
pub mod observe;
pub mod observed;
pub mod params;
pub mod plugins;
pub mod recommend;
pub mod regress;
pub mod rows;
pub mod slurm;
pub mod sweeps;
pub mod transport;

pub use error::ErrorBody;

#[cfg(test)]
mod hostile_props;

/// Header carrying the idempotency key of a result upload (also present in the body).
pub const UPLOAD_KEY_HEADER: &str = "idempotency-key";

/// Response header of a list endpoint whose page was full: the opaque cursor that asks for
/// the next page (`?cursor=`, with the same filters). Absent on the last page.
pub const NEXT_CURSOR_HEADER: &str = "x-next-cursor";

/// Header with which an agent names the hash it computed over the facts it uploads, so the
/// server's "send facts again?" answer compares like with like.
pub const FACTS_SHA_HEADER: &str = "x-heddle-facts-sha256";

/// SHA-256 (hex) of a node's facts without `collected_at`: equal hashes mean nothing the
/// agent reports has changed. serde_json's maps are sorted, so equal facts give equal
/// bytes. The agent (what it sends in [`FACTS_SHA_HEADER`]) and the server (what it
/// stores when the header is absent) both hash with this.
pub fn facts_sha256(facts: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let mut copy = facts.clone();
    if let Some(obj) = copy.as_object_mut() {
        obj.remove("collected_at");
    }
    let bytes = serde_json::to_vec(&copy).expect("a JSON value always serializes");
    hex::encode(Sha256::digest(&bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn facts_hash_ignores_collection_time_and_key_order() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"b":1,"a":2,"collected_at":"x"}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{"a":2,"collected_at":"y","b":1}"#).unwrap();
        assert_eq!(super::facts_sha256(&a), super::facts_sha256(&b));
        let c = serde_json::json!({"a": 3, "b": 1});
        assert_ne!(super::facts_sha256(&a), super::facts_sha256(&c));
    }
}
