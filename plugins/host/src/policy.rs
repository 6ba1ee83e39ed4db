//! What a component may import and must export, checked before it is ever instantiated.

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::HostError;

/// The newest contract this host implements (what the SDK builds against).
pub const CONTRACT: &str = Contract::V02.package();
/// The interface a detector exports (`<package>/<interface>@<version>`); the 0.1 form is
/// accepted too.
pub const EXPORT_INTERFACE: &str = "heddle:plugin/plugin@0.2.0 (or @0.1.0)";

/// A released version of the `heddle:plugin` contract. Hosts keep every one: a component is
/// called through the bindings of the version it exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contract {
    /// `detect(facts-json)`; no `reads`, no expectations.
    V01,
    /// Adds `plugin-info.reads` (facts projection) and `detection.expectations`.
    V02,
}

impl Contract {
    pub const fn package(self) -> &'static str {
        match self {
            Contract::V01 => "heddle:plugin@0.1.0",
            Contract::V02 => "heddle:plugin@0.2.0",
        }
    }

    /// The contract of an exported `heddle:plugin/plugin@<version>`, by its minor line.
    fn of_version(version: &str) -> Option<Self> {
        if version.starts_with("0.1.") {
            Some(Contract::V01)
        } else if version.starts_with("0.2.") {
            Some(Contract::V02)
        } else {
            None
        }
    }
}

/// Interfaces a plugin may import, without their `@version`. The WASI ones are what language
/// runtimes link whether or not a plugin uses them: Rust's standard library on
/// `wasm32-wasip2`, and CPython (componentize-py), which adds `wasi:sockets`. Linking them
/// grants nothing: the sandbox gives them nothing to reach and refuses every socket (see
/// `sandbox`). HTTP and anything else are refused here, before a component is instantiated.
const ALLOWED_IMPORTS: &[&str] = &[
    "heddle:plugin/log",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Every import of `component`, sorted, or the first one outside the allow-list.
pub fn check_imports(engine: &Engine, component: &Component) -> Result<Vec<String>, HostError> {
    let mut imports: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    imports.sort();
    if let Some(bad) = imports.iter().find(|name| !allowed_import(name)) {
        return Err(HostError::DisallowedImport {
            import: bad.clone(),
        });
    }
    Ok(imports)
}

fn allowed_import(name: &str) -> bool {
    let bare = unversioned(name);
    // Only the 0.2.x WASI line and our own released contracts are linked.
    let version_ok = match name.split_once('@') {
        Some((_, v)) if bare.starts_with("wasi:") => v.starts_with("0.2."),
        Some((_, v)) => Contract::of_version(v).is_some(),
        None => false,
    };
    version_ok && ALLOWED_IMPORTS.contains(&bare)
}

/// The contract whose detector interface the component exports (the newest, should it export
/// several), or why it is not a detector.
pub fn check_exports(engine: &Engine, component: &Component) -> Result<Contract, HostError> {
    let exports: Vec<String> = component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let found = exports
        .iter()
        .filter_map(|e| {
            e.split_once('@')
                .filter(|(bare, _)| *bare == "heddle:plugin/plugin")
        })
        .filter_map(|(_, v)| Contract::of_version(v))
        .max_by_key(|c| *c as u8);
    found.ok_or_else(|| HostError::WrongWorld {
        expected: EXPORT_INTERFACE,
        found: exports.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_is_by_interface_and_version_line() {
        assert!(allowed_import("wasi:cli/stdout@0.2.3"));
        assert!(allowed_import("heddle:plugin/log@0.1.0"));
        assert!(allowed_import("heddle:plugin/log@0.2.0"));
        assert!(!allowed_import("heddle:plugin/log@0.3.0"));
        assert!(allowed_import("wasi:sockets/tcp@0.2.3"));
        assert!(allowed_import("wasi:sockets/instance-network@0.2.0"));
        assert!(!allowed_import("wasi:sockets/tcp@0.3.0"));
        assert!(!allowed_import("wasi:http/outgoing-handler@0.2.0"));
        assert!(!allowed_import("wasi:cli/stdout@0.3.0"));
        assert!(!allowed_import("wasi:cli/stdout"));
        assert!(!allowed_import("heddle:plugin/log@1.0.0"));
        assert!(!allowed_import("evil"));
    }
}
