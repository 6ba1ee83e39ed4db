#!/usr/bin/env bash
# Prepares and runs the fleet test (tests/tests/fleet.rs): release binaries, the Docker
# images (docker/build-images.sh), schemathesis in a venv under ~/.cache/heddle-venv, then
# `cargo test -p heddle-e2e --test fleet --test fleet_outage --test fleet_faults --test fleet_db_faults`
# (fleet_outage stops Postgres for two minutes under running jobs; the last two break an
# agent's disk and clock, kill replicas and cut one off from Postgres for 30 s). Each step
# is skipped when already done.
#
#   scripts/fleet-test.sh            # everything
#   scripts/fleet-test.sh --prepare  # only the binaries, images and venv (what CI runs first)
#
# HEDDLE_PROFILE=dev puts the debug binaries in the images instead: what `cargo test` builds
# anyway, so CI compiles nothing twice (the release build is for images you ship).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
venv=${HEDDLE_VENV:-$HOME/.cache/heddle-venv}
# Versions and hashes: scripts/requirements/fleet-test.txt. Newer hypothesis releases break
# schemathesis 3.39 ('many' object has no attribute 'more'), hence its own pin there.
requirements="$repo/scripts/requirements/fleet-test.txt"
pinned() { awk -v p="$1==" 'index($0, p) == 1 { sub(p, ""); print $1; exit }' "$requirements"; }
schemathesis_version=$(pinned schemathesis)
hypothesis_version=$(pinned hypothesis)

if [[ ! -x "$venv/bin/schemathesis" ]] || ! "$venv/bin/schemathesis" --version 2>/dev/null | grep -q "$schemathesis_version" \
    || ! "$venv/bin/pip" show hypothesis 2>/dev/null | grep -qx "Version: $hypothesis_version"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --require-hashes --no-deps -r "$requirements"
fi
if [[ "${HEDDLE_PROFILE:-release}" == dev ]]; then
    cargo build -p heddle-server -p heddle-agent
    HEDDLE_BIN_DIR="$CARGO_TARGET_DIR/debug" docker/build-images.sh
else
    cargo build --release -p heddle-server -p heddle-agent
    docker/build-images.sh
fi
[[ "${1:-}" == --prepare ]] && exit 0
HEDDLE_VENV="$venv" cargo test -p heddle-e2e --test fleet --test fleet_outage --test fleet_faults --test fleet_db_faults -- --nocapture
