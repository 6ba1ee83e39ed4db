//! The first-party plugins, compiled into the binary that enables the `bundled` feature (the
//! agent), so `heddle-agent detect` works offline with nothing installed beside it.

/// (name, component bytes), in run order: generic topology first, then the
/// environment-specific detectors, whose recommendations win a conflict (see docs/plugins.md).
pub const FIRST_PARTY: &[(&str, &[u8])] = &[
    (
        "dgx-affinity",
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../dist/dgx-affinity.wasm"
        )),
    ),
    (
        "azure-nd",
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../dist/azure-nd.wasm"
        )),
    ),
    (
        "runai-roce",
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../dist/runai-roce.wasm"
        )),
    ),
];
