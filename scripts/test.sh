#!/usr/bin/env bash
# Runs the whole test suite: starts Postgres if needed, builds the guest plugins, then
# `cargo test` over the workspace. Every test makes its own throwaway database.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh)
export HEDDLE_TEST_DATABASE_URL
echo "test.sh: Postgres at $HEDDLE_TEST_DATABASE_URL; target dir $CARGO_TARGET_DIR" >&2
if [[ -x scripts/build-plugins.sh ]]; then
    scripts/build-plugins.sh
fi
# CI=true makes insta fail on a changed snapshot instead of writing a new one.
export CI=${CI:-true}
cargo test --workspace --locked "$@"
