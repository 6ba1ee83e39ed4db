#!/usr/bin/env bash
# Builds the Leptos dashboard into frontend/dist/ (index.html, style.css, the wasm-bindgen
# JS glue and the .wasm), the folder heddle-server serves with HEDDLE_DASHBOARD_DIR.
#
# Plain cargo + wasm-bindgen + wasm-opt -Oz: no trunk, no cargo-leptos.
# Needs: the wasm32-unknown-unknown target, wasm-bindgen-cli at the version the frontend's
# Cargo.lock pins (the JS glue and the wasm must come from the same version) and wasm-opt
# from binaryen 116 (Debian's is too old for the output of current rustc and corrupts it
# without a word); scripts/setup.sh installs them when missing.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
front="$repo/frontend"
dist="$front/dist"
target_dir="${CARGO_TARGET_DIR:-$front/target}"
wasm="$target_dir/wasm32-unknown-unknown/release/heddle-frontend.wasm"

# The wasm target and the wasm-bindgen-cli version frontend/Cargo.lock pins.
"$repo/scripts/setup.sh" --only rust

export CARGO_TARGET_DIR="$target_dir"
cargo build --release --target wasm32-unknown-unknown --manifest-path "$front/Cargo.toml"

# Build into a fresh folder and swap it in, so a running server never serves a mix.
staging="$(mktemp -d "$front/.dist.XXXXXX")"
trap 'rm -rf "$staging"' EXIT
wasm-bindgen --target web --no-typescript --out-dir "$staging" --out-name heddle_frontend "$wasm"
bundle="$staging/heddle_frontend_bg.wasm"
before=$(stat -c %s "$bundle")
wasm-opt -Oz "$bundle" -o "$bundle.opt"
mv "$bundle.opt" "$bundle"
cp "$front/index.html" "$front/style.css" "$staging/"
chmod 755 "$staging"
rm -rf "$dist.old"
[[ -d "$dist" ]] && mv "$dist" "$dist.old"
mv "$staging" "$dist"
rm -rf "$dist.old"
trap - EXIT

raw=$(stat -c %s "$dist/heddle_frontend_bg.wasm")
gz=$(gzip -9 -c "$dist/heddle_frontend_bg.wasm" | wc -c)
echo "build-frontend: $dist (wasm $raw bytes after wasm-opt -Oz, $before before; $gz gzipped)"
