//! What Heddle's tests share, in one place: a server on a database of its own, the one HTTP
//! client the tests call the API with, enrolled fake agents that speak the agent protocol
//! by hand, waiting for what happens later, built plugins and fixtures, and the proptest
//! mutators of the property tests of hostile input.
//!
//! The server and the database are heddle-server's `testing` module (feature
//! `test-support`), re-exported here: they reach inside the server (its migrations, its
//! state and `serve`), and the load generator, which is no test, makes databases with
//! them too. Everything else a test file needs from another lives here; what one file
//! alone needs stays in that file.
//!
//! Feature `server` (what the server's, the agent's, the CLI's and the end-to-end tests
//! take) adds the server and everything that talks to it; without it the kit builds for a
//! crate below the server (`heddle-types`, the plugin host).

pub mod files;
pub mod props;
pub mod results;

#[cfg(feature = "server")]
mod agent;
#[cfg(feature = "server")]
mod api;
#[cfg(feature = "server")]
mod wait;

#[cfg(feature = "server")]
pub use agent::{FakeAgent, enroll, enroll_with, node_with_history};
#[cfg(feature = "server")]
pub use api::Api;
#[cfg(feature = "server")]
pub use heddle_server::testing::{TEST_ADMIN_TOKEN, TestDb, TestServer, private_pg, spool};
#[cfg(feature = "server")]
pub use wait::eventually;
