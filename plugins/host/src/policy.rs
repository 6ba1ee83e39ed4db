//! What a component may import and must export, checked before it is ever instantiated.

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::HostError;

/// The contract this host implements; exports are matched on it.
pub const CONTRACT: &str = "heddle:plugin@0.1.0";
/// The interface a detector exports (`<package>/<interface>@<version>`).
pub const EXPORT_INTERFACE: &str = "heddle:plugin/plugin@0.1.0";

/// Interfaces a plugin may import, without their `@version`. The WASI ones are what Rust's
/// standard library pulls in on `wasm32-wasip2`; the sandbox gives them nothing to reach
/// (see `sandbox`). Sockets and HTTP are absent on purpose.
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
];

fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// Every import of `component`, sorted, or the first one outside the allow-list.
pub fn check_imports(engine: &Engine, component: &Component) -> Result<Vec<String>, HostError> {
    let mut imports: Vec<String> = component.component_type().imports(engine).map(|(name, _)| name.to_string()).collect();
    imports.sort();
    if let Some(bad) = imports.iter().find(|name| !allowed_import(name)) {
        return Err(HostError::DisallowedImport { import: bad.clone() });
    }
    Ok(imports)
}

fn allowed_import(name: &str) -> bool {
    let bare = unversioned(name);
    // Only the 0.2.x WASI line and our own 0.1.x contract are linked.
    let version_ok = match name.split_once('@') {
        Some((_, v)) if bare.starts_with("wasi:") => v.starts_with("0.2."),
        Some((_, v)) => v.starts_with("0.1."),
        None => false,
    };
    version_ok && ALLOWED_IMPORTS.contains(&bare)
}

/// Fails unless the component exports the detector interface of a 0.1.x contract.
pub fn check_exports(engine: &Engine, component: &Component) -> Result<(), HostError> {
    let exports: Vec<String> = component.component_type().exports(engine).map(|(name, _)| name.to_string()).collect();
    let found = exports
        .iter()
        .any(|e| unversioned(e) == unversioned(EXPORT_INTERFACE) && e.split_once('@').is_some_and(|(_, v)| v.starts_with("0.1.")));
    if found {
        Ok(())
    } else {
        Err(HostError::WrongWorld { expected: EXPORT_INTERFACE, found: exports.join(", ") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_is_by_interface_and_version_line() {
        assert!(allowed_import("wasi:cli/stdout@0.2.3"));
        assert!(allowed_import("heddle:plugin/log@0.1.0"));
        assert!(!allowed_import("wasi:sockets/tcp@0.2.3"));
        assert!(!allowed_import("wasi:http/outgoing-handler@0.2.0"));
        assert!(!allowed_import("wasi:cli/stdout@0.3.0"));
        assert!(!allowed_import("wasi:cli/stdout"));
        assert!(!allowed_import("heddle:plugin/log@1.0.0"));
        assert!(!allowed_import("evil"));
    }
}
