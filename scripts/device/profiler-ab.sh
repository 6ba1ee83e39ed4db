#!/usr/bin/env bash
# What Heddle's NCCL profiler plugin costs a PyTorch job, measured as alternating pairs:
# PAIRS times, scripts/device/profiler_overhead.py without the plugin and with it (the order
# flips every pair, so drift on a shared host falls on both sides), each rank pinned to its
# own cores, the median of several timed batches per size. Writes one JSON document per
# run to $OUT/ab/ and the table of medians to $OUT/profiler-ab.txt (docs/benchmarks.md).
#
#   bash scripts/device/profiler-ab.sh .carry/nccl-plugins [ROUNDS]   # default 5 rounds
#   AB_SETTINGS="without with always nokernel" bash scripts/device/profiler-ab.sh .carry/nccl-plugins 4
set -uo pipefail
export NCCL_NVLS_ENABLE=0
repo=$(cd "$(dirname "$0")/../.." && pwd)
plugins=$(cd "$1" && pwd) || exit 2
pairs=${2:-5}
out=${OUT:-$PWD/profiler-ab-out}
mkdir -p "$out/ab"
prof="$plugins/libnccl-profiler-heddle.so"
[[ -s "$prof" ]] || { echo "profiler-ab: no $prof" >&2; exit 2; }
spool=$(mktemp -d /tmp/heddle-ab.XXXXXX)
trap 'rm -rf "$spool"' EXIT
# AB_ARGS replaces the sizes and batches; AB_FIELD picks the figure compared (us_per_op,
# the median batch; us_per_op_mean, the mean over all batches, for settings that are on
# for part of the time: run long batches then, e.g. AB_ARGS="--sizes 1M --batches 40 --scale 50").
read -r -a args <<<"${AB_ARGS:---sizes 8,1M,1G --batches 7 --scale 2}"
# AB_PIN: each local rank's cores (':'-separated); AB_ONE_GPU=1 puts both ranks on GPU 0 as
# two NCCL hosts (over sockets), for a machine with one GPU.
args+=(--pin-cpus "${AB_PIN:-0-7:16-23}")
[[ ${AB_ONE_GPU:-0} == 1 ]] && args+=(--one-gpu)
export AB_FIELD=${AB_FIELD:-us_per_op}

one() { # NAME [ENV...]
    local name=$1
    shift
    rm -rf "${spool:?}"/*
    timeout 120 env "$@" python3 "$repo/scripts/device/profiler_overhead.py" "${args[@]}" \
        --out "$out/ab/$name.json" >/dev/null 2>"$out/ab/$name.err" ||
        echo "profiler-ab: $name failed (ab/$name.err)" >&2
}

# Settings: the plugin not loaded; loaded with its defaults (kernel channel events for the
# first tenth of each interval); with kernel channel events all the time
# (HEDDLE_PROFILER_KERNEL=1); never (HEDDLE_PROFILER_KERNEL=0); loaded but disabled
# (HEDDLE_PROFILER_DISABLE=1). AB_SETTINGS picks (default "without with"); every round runs
# them all, in an order that rotates.
with=(NCCL_PROFILER_PLUGIN="$prof" HEDDLE_PROFILER_SPOOL="$spool")
read -r -a settings <<<"${AB_SETTINGS:-without with}"
run_setting() { # ROUND SETTING
    case $2 in
        without) one "$1-without" ;;
        with) one "$1-with" "${with[@]}" ;;
        always) one "$1-always" "${with[@]}" HEDDLE_PROFILER_KERNEL=1 ;;
        nokernel) one "$1-nokernel" "${with[@]}" HEDDLE_PROFILER_KERNEL=0 ;;
        disabled) one "$1-disabled" "${with[@]}" HEDDLE_PROFILER_DISABLE=1 ;;
        *) echo "profiler-ab: unknown setting $2" >&2; exit 2 ;;
    esac
}
n=${#settings[@]}
for i in $(seq 1 "$pairs"); do
    for j in $(seq 0 $((n - 1))); do
        run_setting "$i" "${settings[$(((i + j) % n))]}"
    done
done
python3 - "$out/ab" "$pairs" >"$out/profiler-ab.txt" <<'PY'
import json, os, statistics, sys
d, pairs = sys.argv[1], int(sys.argv[2])
runs = {}
for f in sorted(os.listdir(d)):
    if f.endswith(".json"):
        runs[f[:-5]] = json.load(open(os.path.join(d, f)))
if not runs:
    sys.exit("no run wrote its JSON")
meta = next(iter(runs.values()))
field = os.environ.get("AB_FIELD", "us_per_op")
print(f"profiler plugin A/B ({field}): {pairs} rounds, settings in rotating order, {meta.get('gpu')}, torch {meta.get('torch')}, NCCL {meta.get('nccl')};"
      f" per run the slower rank's median batch")

def per_run(doc):  # (func, bytes) -> (us per op, busbw) of the slower rank
    out = {}
    for r in doc.get("ranks", []):
        for row in r.get("results", []):
            k = (row["func"], row["bytes"])
            if k not in out or row[field] > out[k][0]:
                out[k] = (row[field], row["busbw_GBps"])
    return out

table = {name: per_run(doc) for name, doc in runs.items()}
keys = sorted({k for t in table.values() for k in t})
order = [x for x in ("without", "with", "always", "nokernel", "disabled") if any(n.endswith("-" + x) for n in table)]
print(f"{'collective':<11}{'bytes':>11}  " + "  ".join(f"{x + ' us':>12}" for x in order) + "   ratio to without; busbw GB/s")
for k in keys:
    med = {}
    for x in order:
        vals = [t[k] for n, t in table.items() if n.split("-", 1)[1] == x and k in t]
        if vals:
            med[x] = (statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals), [v[0] for v in vals])
    if "without" not in med:
        continue
    base = med["without"][0]
    print(f"{k[0]:<11}{k[1]:>11}  " + "  ".join(f"{med[x][0]:>12.2f}" if x in med else f"{'-':>12}" for x in order)
          + "   " + ", ".join(f"{x} {med[x][0] / base:.3f}" for x in order if x in med and x != "without")
          + "; " + ", ".join(f"{x} {med[x][1]:.1f}" for x in order if x in med))
    for x in order:
        if x in med:
            print(f"{'':<24}{x}: " + ", ".join(f"{v:.1f}" for v in med[x][2]))
PY
cat "$out/profiler-ab.txt"

