#!/usr/bin/env bash
# Builds the WebAssembly plugins (first-party, template and the hostile test plugins) for
# wasm32-wasip2 and copies them to plugins/dist/, where the agent (heddle-plugin-host's
# `bundled` feature) and the host's tests and benchmark load them from.
#
# Needs: rustup target add wasm32-wasip2
# Run before `cargo test` / `cargo build -p heddle-agent` on a clean clone.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dist="$repo/plugins/dist"
# Guests get their own target dir unless the caller shares one; the triple keeps them apart.
target_dir="${CARGO_TARGET_DIR:-$repo/plugins/target}"
profile_dir="$target_dir/wasm32-wasip2/release"

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
    echo "build-plugins: the wasm32-wasip2 target is missing; run: scripts/setup.sh (or rustup target add wasm32-wasip2)" >&2
    exit 1
fi

export CARGO_TARGET_DIR="$target_dir"
# From inside plugins/ so plugins/.cargo/config.toml (the guests' stack size) applies.
cd "$repo/plugins"
cargo build --release --target wasm32-wasip2 --manifest-path "$repo/plugins/Cargo.toml" --workspace
cargo build --release --target wasm32-wasip2 --manifest-path "$repo/plugins/template/Cargo.toml"

mkdir -p "$dist"
copy() { # crate artifact name (underscores) -> dist name
    local src="$profile_dir/$1.wasm"
    [[ -f "$src" ]] || { echo "build-plugins: $src was not produced" >&2; exit 1; }
    # Unchanged bytes keep their mtime, so the agent is not rebuilt for nothing.
    if ! cmp -s "$src" "$dist/$2.wasm"; then
        cp "$src" "$dist/$2.wasm.tmp" && mv "$dist/$2.wasm.tmp" "$dist/$2.wasm"
    fi
    printf '  %-16s %7d bytes\n' "$2.wasm" "$(stat -c %s "$dist/$2.wasm")"
}
echo "build-plugins: writing $dist"
copy heddle_plugin_azure_nd azure-nd
copy heddle_plugin_runai_roce runai-roce
copy heddle_plugin_dgx_affinity dgx-affinity
copy heddle_plugin_misbehave misbehave
copy heddle_plugin_netclient netclient
copy heddle_plugin_contract_v01 contract-v01
copy my_heddle_plugin template
