//! Plugins on the server, one module per job: [`engine_cache`] the engine and its one
//! compile cache (upload validation, dry runs and the reconciler all go through it),
//! [`reconciler`] what keeps every node's plugin results current (run by
//! `workers/plugin_reconciler.rs`), [`outcomes`] the store of what each plugin said about
//! each node, [`store`] the plugins themselves (their bytes, versions and which is enabled). The recommendations and traits plugins
//! produce are written and merged by `crate::recommendations`, the one place for them.

pub mod engine_cache;
pub mod outcomes;
pub mod reconciler;
pub mod store;

pub use engine_cache::PluginRuntime;
pub use reconciler::{SWEEP_EVERY, reconcile, sweep};
