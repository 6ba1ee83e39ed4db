//! With the `bundled` feature the first-party plugins are embedded with `include_bytes!` from
//! `plugins/dist/`, which scripts/build-plugins.sh writes. Checked here so a clean clone gets
//! an instruction rather than a bare "file not found".

use std::path::PathBuf;

const BUNDLED: &[&str] = &["azure-nd", "runai-roce", "dgx-affinity"];

fn main() {
    if std::env::var_os("CARGO_FEATURE_BUNDLED").is_none() {
        return;
    }
    let dist = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../dist");
    for name in BUNDLED {
        let path = dist.join(format!("{name}.wasm"));
        println!("cargo:rerun-if-changed={}", path.display());
        if !path.is_file() {
            panic!(
                "\n\nheddle-plugin-host: {} is missing.\nThe agent embeds the first-party plugins; build them first:\n\n    \
                 rustup target add wasm32-wasip2\n    scripts/build-plugins.sh\n\n",
                path.display()
            );
        }
    }
}
