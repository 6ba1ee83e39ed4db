//! Write Heddle detector plugins in Rust.
//!
//! A plugin is a type implementing [`Plugin`], exported with [`export_plugin!`] and built with
//! `cargo build --release --target wasm32-wasip2`. The logic works on plain Rust types
//! ([`Facts`], [`Detection`]) so it can be unit-tested natively with `cargo test`; only the
//! thin export glue is compiled for WebAssembly.
//!
//! ```ignore
//! use heddle_plugin_sdk::{Detection, Facts, Info, Plugin, PluginError};
//!
//! struct Hello;
//! impl Plugin for Hello {
//!     fn info() -> Info { Info::new("hello", env!("CARGO_PKG_VERSION"), "says hello") }
//!     fn detect(facts: &Facts) -> Result<Detection, PluginError> {
//!         let mut d = Detection::default();
//!         if let Some(h) = facts.str_at("/host/hostname") { d.add_trait("hello.host", h); }
//!         Ok(d)
//!     }
//! }
//! heddle_plugin_sdk::export_plugin!(Hello);
//! ```

// The generated bindings name the SDK by its crate path, so it must resolve inside the SDK too.
extern crate self as heddle_plugin_sdk;

pub mod facts;
pub mod json;
pub mod log;
mod types;

pub use facts::Facts;
pub use json::Json;
pub use serde_json;
pub use types::{Detection, EnvVar, Expectation, GpuAffinity, Info, PluginError};

/// The version of the `heddle:plugin` WIT package these bindings implement.
pub const CONTRACT_VERSION: &str = "0.2.0";

/// Generated bindings for the `heddle:plugin/detector` world. Plugins normally never touch
/// them; [`export_plugin!`] does.
#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/v0.2",
        world: "heddle:plugin/detector",
        default_bindings_module: "heddle_plugin_sdk::bindings",
        pub_export_macro: true,
        export_macro_name: "__heddle_export_detector",
        runtime_path: "heddle_plugin_sdk::__wit_bindgen_rt",
    });
}

#[doc(hidden)]
pub use wit_bindgen::rt as __wit_bindgen_rt;

/// A detector plugin: static metadata plus a pure function from facts to a detection.
pub trait Plugin {
    fn info() -> Info;

    /// Returns an empty [`Detection`] when the plugin does not apply to the node; an error
    /// only when it applies but cannot make sense of the facts.
    fn detect(facts: &Facts) -> Result<Detection, PluginError>;
}

/// Parses the facts and runs the plugin: the same path the WebAssembly export takes, so native
/// tests of a plugin exercise exactly what the host will call.
///
/// Natively (a plugin's own tests) the facts are first cut down to [`Info::reads`] as a host
/// would cut them, so a lookup outside the declared reads fails in tests, not in production.
pub fn run<P: Plugin>(facts_json: &str) -> Result<Detection, PluginError> {
    #[cfg(not(target_arch = "wasm32"))]
    let facts_json = {
        let reads = P::info().reads;
        if reads.is_empty() {
            facts_json.to_string()
        } else {
            let whole: serde_json::Value = serde_json::from_str(facts_json)
                .map_err(|e| PluginError::bad_facts(format!("facts are not valid JSON: {e}")))?;
            heddle_plugin_reads::Reads::new(&reads)
                .project(&whole)
                .to_string()
        }
    };
    #[cfg(target_arch = "wasm32")]
    let facts_json = facts_json.to_string();
    run_owned::<P>(facts_json)
}

/// [`run`] on facts the caller hands over (the WebAssembly export owns its argument).
#[doc(hidden)]
pub fn run_owned<P: Plugin>(facts_json: String) -> Result<Detection, PluginError> {
    P::detect(&Facts::from_json(facts_json)?)
}

/// Exports a [`Plugin`] as the `heddle:plugin/plugin` interface of a component. A no-op when
/// not compiling for WebAssembly, so the same crate also builds for native unit tests.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct HeddleExport;
            impl $crate::bindings::exports::heddle::plugin::plugin::Guest for HeddleExport {
                fn info() -> $crate::bindings::exports::heddle::plugin::plugin::PluginInfo {
                    $crate::__glue::info::<$plugin>()
                }
                fn detect(
                    facts_json: ::std::string::String,
                ) -> ::std::result::Result<
                    $crate::bindings::exports::heddle::plugin::plugin::Detection,
                    $crate::bindings::exports::heddle::plugin::plugin::PluginError,
                > {
                    $crate::__glue::detect::<$plugin>(facts_json)
                }
            }
            $crate::bindings::__heddle_export_detector!(HeddleExport with_types_in $crate::bindings);
        };
    };
}

/// Conversions between the SDK's types and the generated ones, used by [`export_plugin!`].
#[doc(hidden)]
pub mod __glue {
    use crate::bindings::exports::heddle::plugin::plugin as wit;
    use crate::{Plugin, run_owned};

    pub fn info<P: Plugin>() -> wit::PluginInfo {
        let info = P::info();
        wit::PluginInfo {
            name: info.name,
            version: info.version,
            description: info.description,
            reads: info.reads,
        }
    }

    pub fn detect<P: Plugin>(facts_json: String) -> Result<wit::Detection, wit::PluginError> {
        match run_owned::<P>(facts_json) {
            Ok(d) => Ok(wit::Detection {
                traits: d
                    .traits
                    .into_iter()
                    .map(|(key, value)| wit::DetectedTrait { key, value })
                    .collect(),
                env: d
                    .env
                    .into_iter()
                    .map(|e| wit::EnvRecommendation {
                        name: e.name,
                        value: e.value,
                        reason: e.reason,
                    })
                    .collect(),
                affinity: d
                    .affinity
                    .into_iter()
                    .map(|a| wit::GpuAffinity {
                        gpu: a.gpu,
                        cpus: a.cpus,
                        numa: a.numa,
                        nic: a.nic,
                        netdev: a.netdev,
                    })
                    .collect(),
                warnings: d.warnings,
                expectations: d
                    .expectations
                    .into_iter()
                    .map(|e| wit::Expectation {
                        test: e.test,
                        metric: e.metric,
                        min_size_bytes: e.min_size_bytes,
                        value: e.value,
                        source: e.source,
                    })
                    .collect(),
            }),
            Err(e) => Err(wit::PluginError {
                code: e.code,
                message: e.message,
            }),
        }
    }
}
