//! Sandboxed host for Heddle detector plugins (WebAssembly components of the
//! `heddle:plugin/detector` world, see `plugins/wit/`).
//!
//! Every call gets a fresh store with a fuel budget, an epoch deadline, one capped linear
//! memory, capped output and a deny-all WASI context, so a hostile plugin (endless loop,
//! memory bomb, flood of output, panic, forbidden import, wrong world, not even a component)
//! is stopped and reported as a [`HostError`] naming the reason while the host keeps serving.
//!
//! The API callers use:
//! - [`PluginHost::validate`]: bytes → [`ComponentInfo`] or a clear error (server uploads);
//! - [`PluginHost::run`]: bytes + facts JSON + [`Limits`] → [`Report`] with [`Usage`]
//!   (fuel, time, memory), or an error carrying the usage up to the stop;
//! - [`PluginHost::load`] + [`PluginHost::call`]: the same without re-hashing the bytes on
//!   every call (the agent's and server's hot path);
//! - [`run_on_facts_json`]: the one-shot form of `run` for `heddle plugin test`.

mod error;
mod host;
mod limits;
mod policy;
mod report;
mod sandbox;

#[cfg(feature = "bundled")]
pub mod bundled;

pub use error::HostError;
pub use host::{HostConfig, LoadedPlugin, PluginHost};
pub use limits::Limits;
pub use policy::{CONTRACT, EXPORT_INTERFACE};
pub use report::{
    CompileTime, ComponentInfo, Detection, EnvRecommendation, GpuAffinity, LogLevel, LogRecord, PluginInfo, Report,
    Usage,
};

/// Host-side bindings of the WIT world. Only the `detector` world of the 0.1 contract exists
/// today; a 0.2 contract gets a sibling module and `PluginHost` dispatches on the exported
/// interface's version (see docs/plugins.md).
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "heddle:plugin/detector",
    });
}

/// Validates and runs one component on one facts document with a throwaway host. Convenient
/// for one-off use (the CLI's `plugin test`); long-lived callers should keep a [`PluginHost`]
/// so compiled components are cached.
pub fn run_on_facts_json(bytes: &[u8], facts_json: &str, limits: &Limits) -> Result<Report, HostError> {
    PluginHost::new(HostConfig::default())?.run(bytes, facts_json, limits)
}
