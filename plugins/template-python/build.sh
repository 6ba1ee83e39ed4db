#!/usr/bin/env bash
# Builds this folder's plugin (app.py) into a WebAssembly component with componentize-py from
# PyPI, against the Heddle contract and Python SDK of a Heddle checkout.
#
#   HEDDLE_CHECKOUT=/path/to/heddle ./build.sh [OUT.wasm]    # default: ./plugin.wasm
#
# HEDDLE_CHECKOUT defaults to ../.. (this folder inside a checkout).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
checkout="${HEDDLE_CHECKOUT:-$here/../..}"
out="${1:-$here/plugin.wasm}"
exec "$checkout/scripts/build-python-plugin.sh" "$here" "$out"
