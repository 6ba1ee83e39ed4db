#!/usr/bin/env bash
# The agent protocol under load, the way docs/benchmarks.md ("Agent protocol") measures it:
# release builds of heddle-server and heddle-loadgen, then the load generator at 10,000 and
# 50,000 agents (one replica, a heartbeat every 10 s, 30 s of steady state), one after the
# other on a fresh database each. Writes every case's report into one JSON file
# (`{"commit", "machine", "cases": [...]}`), which `--compare` (here or in heddle-loadgen)
# holds a later run against.
#
#   scripts/bench-protocol.sh [--out FILE] [--compare BASELINE.json] [--agents "10000 50000"]
#                             [--replicas N] [--no-build] [--fail-if-worse]
#
# Timings need a quiet machine: with a build running beside it, p99s double. The script
# prints the load average before each case; compare runs made back to back.
set -euo pipefail
cd "$(dirname "$0")/.."

out=bench-protocol.json
baseline=
agents="10000 50000"
replicas=1
build=1
fail=
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --compare) baseline=$2; shift 2 ;;
        --agents) agents=$2; shift 2 ;;
        --replicas) replicas=$2; shift 2 ;;
        --no-build) build=; shift ;;
        --fail-if-worse) fail=--fail-if-worse; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "bench-protocol: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -n $baseline && ! -r $baseline ]]; then
    echo "bench-protocol: cannot read the baseline $baseline" >&2
    exit 2
fi
if [[ -n $fail && -z $baseline ]]; then
    echo "bench-protocol: --fail-if-worse needs --compare BASELINE.json" >&2
    exit 2
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
if [[ -n $build ]]; then
    cargo build --release -p heddle-server -p heddle-e2e --bin heddle-server --bin heddle-loadgen
fi
loadgen=$CARGO_TARGET_DIR/release/heddle-loadgen
[[ -x $loadgen ]] || { echo "bench-protocol: no $loadgen (drop --no-build)" >&2; exit 1; }
HEDDLE_TEST_DATABASE_URL=$(scripts/pg-ensure.sh)
export HEDDLE_TEST_DATABASE_URL

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
worse=0
for n in $agents; do
    echo "bench-protocol: $n agents, $replicas replica(s), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    args=(--agents "$n" --replicas "$replicas" --heartbeat-s 10 --duration-s 30 --json)
    [[ -n $baseline ]] && args+=(--compare "$baseline" $fail)
    rc=0
    "$loadgen" "${args[@]}" > "$tmp/$n.json" || rc=$?
    if [[ $rc -eq 3 ]]; then
        worse=1
    elif [[ $rc -ne 0 ]]; then
        echo "bench-protocol: the $n-agent case failed (exit $rc)" >&2
        exit "$rc"
    fi
    python3 - "$tmp/$n.json" <<'EOF' >&2
import json, sys
r = json.load(open(sys.argv[1]))
lat = r["latency"]
f = lambda k: "%s / %s" % tuple(round(lat.get(k, {}).get(p, float("nan")), 1) for p in ("p50_ms", "p99_ms"))
print(f"  errors {r['errors']} · heartbeat p50/p99 {f('heartbeat')} ms · claim {f('claim')} ms · "
      f"result {f('result')} ms · server CPU {r['server_cpu_percent']} %")
for line in r.get("compare", {}).get("figures", []):
    if line["ratio"] is not None:
        flag = "  worse" if line["ratio"] > 1.5 else ""
        print(f"  {line['figure']:<18} {line['baseline']:>10.2f} -> {line['now']:>10.2f}  {line['ratio']:.2f}x{flag}")
EOF
done
python3 - "$out" "$(git rev-parse --short HEAD)$(git diff --quiet || echo +)" "$tmp" $agents <<'EOF'
import json, os, platform, sys
out, commit, tmp, *agents = sys.argv[1:]
cases = [json.load(open(os.path.join(tmp, f"{n}.json"))) for n in agents]
machine = f"{os.cpu_count()} cores, {round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, {platform.platform()}"
json.dump({"commit": commit, "machine": machine, "cases": cases}, open(out, "w"), indent=1)
print(f"bench-protocol: wrote {out} ({len(cases)} case(s), commit {commit})", file=sys.stderr)
EOF
exit $(( worse ? 3 : 0 ))
