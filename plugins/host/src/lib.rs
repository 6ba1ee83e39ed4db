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
//! - [`PluginHost::load`] + [`PluginHost::call`] with [`FactsJson`]: the same without
//!   re-hashing the bytes or re-checking the facts on every call (the server's hot path);
//! - [`run_on_facts_json`]: the one-shot form of `run` for `heddle plugin test`.

mod clock;
mod compile;
mod error;
mod facts;
mod host;
mod limits;
mod output;
mod policy;
mod report;
mod sandbox;

#[cfg(feature = "bundled")]
pub mod bundled;

pub use error::HostError;
pub use facts::{FactsJson, Reads};
pub use host::{HostConfig, LoadedPlugin, PluginHost};
pub use limits::Limits;
pub use policy::{CONTRACT, Contract, EXPORT_INTERFACE};
pub use report::{
    CompileTime, ComponentInfo, Detection, EnvRecommendation, Expectation, GpuAffinity, LogLevel,
    LogRecord, PluginInfo, Report, Usage,
};

/// Host-side bindings, one module per released contract version. `PluginHost` dispatches on
/// the interface a component exports, so components built against an older contract keep
/// running unchanged (see docs/plugins.md).
pub(crate) mod bindings {
    pub mod v01 {
        wasmtime::component::bindgen!({
            path: "../wit/v0.1",
            world: "heddle:plugin/detector",
        });
    }
    pub mod v02 {
        wasmtime::component::bindgen!({
            path: "../wit/v0.2",
            world: "heddle:plugin/detector",
        });
    }
}

/// Validates and runs one component on one facts document with a throwaway host. Convenient
/// for one-off use (the CLI's `plugin test`); long-lived callers should keep a [`PluginHost`]
/// so compiled components are cached.
pub fn run_on_facts_json(
    bytes: &[u8],
    facts_json: &str,
    limits: &Limits,
) -> Result<Report, HostError> {
    PluginHost::new(HostConfig::default())?.run(bytes, facts_json, limits)
}
