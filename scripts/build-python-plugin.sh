#!/usr/bin/env bash
# Builds a Python detector plugin into a WebAssembly component with componentize-py (from
# PyPI, installed once into a virtual environment under .heddle/), against the contract in
# plugins/wit/v0.2 and with the heddle_plugin SDK (plugins/python) on its path.
#
#   scripts/build-python-plugin.sh DIR OUT.wasm   # DIR holds app.py, which sets `Plugin`
#   scripts/build-python-plugin.sh                # the repository's Python plugins -> plugins/dist/
#
# A build is skipped when OUT.wasm was built from the same inputs (componentize-py version,
# WIT, SDK and DIR's files, by sha256), so CI and repeated test runs pay for it once.
# Needs python3 with venv; the network only for the first install of componentize-py.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
componentize_version="${HEDDLE_COMPONENTIZE_PY_VERSION:-0.25.1}"
venv="${HEDDLE_PY_VENV:-$repo/.heddle/py}"
cpy="$venv/bin/componentize-py"

ensure_componentize_py() {
    if [[ -x "$cpy" ]] && [[ "$("$cpy" --version 2>/dev/null)" == "componentize-py $componentize_version" ]]; then
        return
    fi
    echo "build-python-plugin: installing componentize-py $componentize_version into $venv" >&2
    python3 -m venv "$venv"
    # The pinned version comes with its hash (scripts/requirements/componentize-py.txt);
    # another one, asked for by HEDDLE_COMPONENTIZE_PY_VERSION, is taken as the index has it.
    local req="$repo/scripts/requirements/componentize-py.txt"
    if grep -q "^componentize-py==$componentize_version " "$req"; then
        "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$req"
    else
        echo "build-python-plugin: componentize-py $componentize_version is not pinned by hash" >&2
        "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$componentize_version"
    fi
}

# sha256 over every input of a build, in a stable order.
inputs_hash() {
    local app="$1"
    {
        echo "componentize-py $componentize_version"
        (cd "$repo" && find plugins/wit/v0.2 plugins/python -type f -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum)
        (cd "$app" && find . -type f -name '*.py' -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum)
    } | sha256sum | cut -d' ' -f1
}

build() { # app dir, output file
    local app out stamp want
    app="$(cd "$1" && pwd)"
    out="$2"
    stamp="$out.inputs-sha256"
    want="$(inputs_hash "$app")"
    if [[ -f "$out" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        printf '  %-24s %9d bytes (unchanged)\n' "$(basename "$out")" "$(stat -c %s "$out")"
        return
    fi
    ensure_componentize_py
    mkdir -p "$(dirname "$out")"
    local started=$SECONDS
    "$cpy" --quiet -d "$repo/plugins/wit/v0.2" -w detector componentize app \
        -p "$app" -p "$repo/plugins/python" -o "$out.tmp"
    mv "$out.tmp" "$out"
    echo "$want" >"$stamp"
    printf '  %-24s %9d bytes (built in %d s)\n' "$(basename "$out")" "$(stat -c %s "$out")" $((SECONDS - started))
}

if (($# == 2)); then
    build "$1" "$2"
elif (($# == 0)); then
    echo "build-python-plugin: writing $repo/plugins/dist" >&2
    build "$repo/plugins/template-python" "$repo/plugins/dist/template-python.wasm"
    build "$repo/plugins/hostile/python" "$repo/plugins/dist/py-misbehave.wasm"
else
    echo "usage: $0 [DIR OUT.wasm]" >&2
    exit 2
fi
