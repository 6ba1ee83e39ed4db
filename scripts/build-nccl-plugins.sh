#!/usr/bin/env bash
# Builds Heddle's NCCL plugins in release, strips them and copies them into OUT_DIR:
#   libnccl-env-heddle.so       (crate nccl-plugins/env, package heddle-nccl-env)
#   libnccl-profiler-heddle.so  (crate nccl-plugins/profiler, package heddle-nccl-profiler),
#                               skipped with a note while that crate does not exist.
# NCCL finds the environment plugin as libnccl-env.so on the loader path, or by
# NCCL_ENV_PLUGIN=heddle (or its absolute path); see docs/jobs.md.
#
# Usage: scripts/build-nccl-plugins.sh OUT_DIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$1"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
mkdir -p "$out"

build() { # package, artifact (lib<crate>.so), installed name
    local package="$1" artifact="$2" installed="$3"
    cargo build --release --locked --manifest-path "$repo/Cargo.toml" -p "$package" --lib
    local src="$target_dir/release/$artifact"
    [[ -f "$src" ]] || { echo "build-nccl-plugins: $src was not produced" >&2; exit 1; }
    # Copy under a temporary name and rename, so a running job that has the old library
    # mapped keeps its pages and a new job never sees half a file.
    install -m 0755 "$src" "$out/.$installed.tmp"
    strip --strip-unneeded "$out/.$installed.tmp"
    mv -f "$out/.$installed.tmp" "$out/$installed"
    echo "build-nccl-plugins: $out/$installed"
}

build heddle-nccl-env libheddle_nccl_env.so libnccl-env-heddle.so
if [[ -f "$repo/nccl-plugins/profiler/Cargo.toml" ]]; then
    build heddle-nccl-profiler libheddle_nccl_profiler.so libnccl-profiler-heddle.so
else
    echo "build-nccl-plugins: nccl-plugins/profiler does not exist yet; libnccl-profiler-heddle.so not built" >&2
fi
