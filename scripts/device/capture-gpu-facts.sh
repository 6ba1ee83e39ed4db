#!/usr/bin/env bash
# Captures what a GPU machine says about its GPUs and NVLinks, to check or replace the
# fixture agent/tests/fixtures/h200x2-vm (docs/device.md): nvidia-smi's views, and
# heddle-agent's facts and NVML answers. Writes one tarball to $OUT (or ./gpu-facts-out).
#
#   bash scripts/device/capture-gpu-facts.sh [.carry]    # heddle-agent from .carry/bin.tar.xz
#   HEDDLE_AGENT=/path/to/heddle-agent bash scripts/device/capture-gpu-facts.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0
carry=${1:-.carry}
out=${OUT:-$PWD/gpu-facts-out}
mkdir -p "$out"
dir=$(mktemp -d /tmp/gpu-facts.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cap="$dir/gpu-facts"
mkdir -p "$cap"

agent=${HEDDLE_AGENT:-}
if [[ -z "$agent" && -s "$carry/bin.tar.xz" ]]; then
    mkdir -p "$dir/bin"
    tar -C "$dir/bin" -xJf "$carry/bin.tar.xz" heddle-agent 2>/dev/null ||
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extract('heddle-agent', sys.argv[2])" "$carry/bin.tar.xz" "$dir/bin"
    agent="$dir/bin/heddle-agent"
fi

run() { # FILE COMMAND...: the output, or why there is none
    local file=$1
    shift
    { echo "\$ $*"; timeout 60 "$@" 2>&1 || echo "(exit $?)"; } >"$cap/$file"
}
run nvidia-smi-q.txt nvidia-smi -q
run topo-m.txt nvidia-smi topo -m
run topo-p2p-n.txt nvidia-smi topo -p2p n
run topo-p2p-r.txt nvidia-smi topo -p2p r
run topo-p2p-w.txt nvidia-smi topo -p2p w
run nvlink-s.txt nvidia-smi nvlink -s
run nvlink-R.txt nvidia-smi nvlink -R
run nvlink-c.txt nvidia-smi nvlink -c
run uname.txt uname -a
if [[ -x "$agent" ]]; then
    run facts.json "$agent" facts --pretty
    run topo-heddle.txt "$agent" facts --topo
    run nvml-nvlinks.json "$agent" facts --nvml-nvlinks
else
    echo "no heddle-agent (give .carry or HEDDLE_AGENT)" >"$cap/facts.json"
fi
tar -C "$dir" -czf "$out/gpu-facts.tar.gz" gpu-facts
for f in topo-m.txt topo-p2p-n.txt nvlink-R.txt; do head -n 12 "$cap/$f"; done
echo "capture-gpu-facts: $out/gpu-facts.tar.gz ($(find "$cap" -type f | wc -l) files)"
