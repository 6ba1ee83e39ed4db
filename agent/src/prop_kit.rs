//! What the agent's property tests of hostile input share (`hostile_props`,
//! `facts/hostile_props.rs`): the kit's generators of arbitrary and mutated bytes seeded
//! from real inputs, the case count, and the time and size bounds every parser must keep
//! (`heddle_testkit::props`), and where the agent's own inputs are.

use std::path::PathBuf;

pub use heddle_testkit::props::*;

pub fn agent_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
