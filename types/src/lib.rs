//! Wire types shared by every Heddle component.
//!
//! This crate owns the JSON shapes that cross a process boundary: the REST API, the agent
//! protocol and the node facts. It does no I/O so the dashboard (wasm) can depend on it.
//! With the `openapi` feature the types also derive `utoipa::ToSchema`, which is how the
//! server's OpenAPI document describes them.

pub mod agent;
pub mod auth;
pub mod error;
pub mod facts;
pub mod health;
pub mod investigations;
pub mod jobs;
pub mod nodes;
pub mod plugins;
pub mod recommend;
pub mod sweeps;

pub use error::ErrorBody;

/// Header carrying the idempotency key of a result upload (also present in the body).
pub const UPLOAD_KEY_HEADER: &str = "idempotency-key";

/// Header with which an agent names the hash it computed over the facts it uploads, so the
/// server's "send facts again?" answer compares like with like.
pub const FACTS_SHA_HEADER: &str = "x-heddle-facts-sha256";
