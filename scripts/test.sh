#!/usr/bin/env bash
# Runs the whole test suite: installs the tools that are missing (scripts/setup.sh --test),
# starts Postgres if needed, builds what the tests load (guest
# plugins, the dashboard, the Docker images and the schemathesis venv for the fleet test),
# then `cargo test` over the workspace and the guest plugin workspace. Every test makes its
# own throwaway database. Extra arguments go to the workspace `cargo test`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
step() { printf '\n== test.sh: %s (%s)\n' "$*" "$(date +%T)" >&2; }

step "tools (scripts/setup.sh --test)"; scripts/setup.sh --test
step "disk (scripts/make-room.sh)"; scripts/make-room.sh

step "format and lints"
for manifest in Cargo.toml plugins/Cargo.toml plugins/template/Cargo.toml frontend/Cargo.toml; do
    cargo fmt --all --check --manifest-path "$manifest"
done
cargo clippy --workspace --all-targets --locked -- -D warnings
# The module graph: the server's and the agent's layers (no upward import, no circle, every
# module placed) and no import circle in any crate (ARCHITECTURE.md).
python3 scripts/module-graph.py server/src >/dev/null
python3 scripts/module-graph.py agent/src >/dev/null
python3 scripts/module-graph.py --workspace >/dev/null
# Licenses, duplicate versions and sources of every workspace's dependencies, by deny.toml
# (advisories, which need the RustSec database, are not checked here). The template keeps
# no lock file: its copies make their own.
for manifest in Cargo.toml plugins/Cargo.toml plugins/template/Cargo.toml frontend/Cargo.toml; do
    locked=(--locked)
    [[ $manifest == plugins/template/* ]] && locked=()
    cargo deny --manifest-path "$manifest" --config deny.toml --log-level error "${locked[@]}" \
        check bans licenses sources
done

step "Postgres"
HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh)
export HEDDLE_TEST_DATABASE_URL
echo "Postgres at $HEDDLE_TEST_DATABASE_URL; target dir $CARGO_TARGET_DIR" >&2

step "compile-time checked queries: .sqlx/ is current (cargo sqlx prepare --check)"
# A throwaway database with the migrations applied, dropped again whatever happens.
sqlx_db="${HEDDLE_TEST_DATABASE_URL%/*}/heddle_sqlx_check_$$"
trap 'DATABASE_URL=$sqlx_db sqlx database drop -y >/dev/null 2>&1 || true' EXIT
DATABASE_URL=$sqlx_db sqlx database create
DATABASE_URL=$sqlx_db sqlx migrate run --source migrations >/dev/null
DATABASE_URL=$sqlx_db cargo sqlx prepare --workspace --check -- --all-targets --locked

step "guest plugins (wasm32-wasip2)"
scripts/build-plugins.sh
step "Python plugins (componentize-py; skipped when their inputs are unchanged)"
scripts/build-python-plugin.sh
step "dashboard (wasm32-unknown-unknown + wasm-bindgen)"
scripts/build-frontend.sh
step "deployment files: Kustomize overlays, alert rules, dashboard, compose"; scripts/check-deploy.sh
step "binaries, Docker images and schemathesis for the fleet test"
HEDDLE_PROFILE=dev scripts/fleet-test.sh --prepare

# CI=true makes insta fail on a changed snapshot instead of writing a new one.
export CI=${CI:-true}
# Every agent the tests start computes the node's GPU map (the built-in plugins, seconds of
# CPU in a debug build); one cache of compiled plugins spares the rest the compilation.
# The agent's own variable: the server's HEDDLE_PLUGIN_CACHE_DIR would reach the test
# servers too, and a test that makes compilation fail would load the plugin from the cache.
export HEDDLE_AGENT_PLUGIN_CACHE_DIR=${HEDDLE_AGENT_PLUGIN_CACHE_DIR:-$CARGO_TARGET_DIR/heddle-agent-plugin-cache}
step "cargo test (workspace)"
# The agent's observed-jobs test loads the NCCL profiler plugin and its driver as built
# artifacts, which `cargo test` alone does not make.
cargo build --locked -p heddle-nccl-profiler
cargo test --workspace --locked --no-fail-fast "$@"
step "cargo test (guest plugin workspace and template, native)"
cargo test --locked --manifest-path plugins/Cargo.toml --workspace
cargo test --manifest-path plugins/template/Cargo.toml
step "Python SDK and template, natively"
python3 -m unittest discover -s plugins/python -t plugins/python
(cd plugins/template-python && python3 -m unittest)
scripts/make-room.sh
step "done"
