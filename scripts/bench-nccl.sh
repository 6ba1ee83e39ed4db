#!/usr/bin/env bash
# `heddle-agent bench nccl` against nccl-tests on the same GPU, same flags, in one go:
# each run of one tool is followed by a run of the other, and the script prints per-size
# time ratios, the wall-time ratio, the time to the first row and the 8 B latency.
#
#   scripts/bench-nccl.sh [--agent PATH] [--nccl-tests DIR] [--runs N] [--out DIR] \
#       [--ours "EXTRA FLAGS"] [-- COLLECTIVE FLAGS...]
#
# Defaults: target/release/heddle-agent, ../shared/reference/nccl-tests (built here with
# make when its build/ is missing: needs nvcc and the NCCL headers), 2 runs, and
# `all_reduce -b 8 -e 8G -f 2 -g 1 -w 5 -n 20`. `--ours` adds flags to our runs only
# (e.g. `--ours "--budget 10s"`), which are then listed after the comparison.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0) unless the caller set it.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
agent=${HEDDLE_AGENT:-$root/target/release/heddle-agent}
nccl_tests=$root/../shared/reference/nccl-tests
runs=2
out=$(mktemp -d)
ours_extra=""
flags=(all_reduce -b 8 -e 8G -f 2 -g 1 -w 5 -n 20)
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) agent=$2; shift 2 ;;
    --nccl-tests) nccl_tests=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --ours) ours_extra=$2; shift 2 ;;
    --) shift; flags=("$@"); break ;;
    *) echo "unknown argument $1 (see the top of $0)" >&2; exit 2 ;;
  esac
done
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$out"
coll=${flags[0]}
theirs=$nccl_tests/build/${coll}_perf
if [ ! -x "$theirs" ]; then
  echo "# building nccl-tests in $nccl_tests" >&2
  make -C "$nccl_tests" -j"$(nproc)" MPI=0 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
    NCCL_HOME="${NCCL_HOME:-/usr}" NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}" \
    >"$out/nccl-tests-build.log" 2>&1 || { tail -20 "$out/nccl-tests-build.log" >&2; exit 1; }
fi
[ -x "$agent" ] || { echo "no heddle-agent at $agent (cargo build --release -p heddle-agent, or --agent PATH)" >&2; exit 1; }

# shellcheck disable=SC2206
ours_flags=($ours_extra)
exec python3 - "$out" "$runs" "$theirs" "$agent" "${#flags[@]}" "${flags[@]}" "${ours_flags[@]}" <<'PY'
import subprocess, sys, time

out, runs, theirs, agent, nflags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
flags = sys.argv[6:6 + nflags]
extra = sys.argv[6 + nflags:]
coll, args = flags[0], flags[1:]

def run(name, cmd):
    """Wall time, time to the first row (both from process start), the rows by size."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first, rows, lines = None, {}, []
    for line in p.stdout:
        lines.append(line)
        f = line.split()
        if f and not line.startswith("#") and f[0].isdigit():
            first = first if first is not None else time.monotonic() - t0
            # size count type redop root  time algbw busbw wrong [ time algbw busbw wrong ]
            rows[int(f[0])] = (float(f[5]), float(f[9]) if len(f) > 9 and f[9] != "N/A" else None,
                               f[8], f[12] if len(f) > 12 else None)
    rc = p.wait()
    wall = time.monotonic() - t0
    with open(f"{out}/{name}.txt", "w") as fh:
        fh.writelines(lines)
    print(f"# {name}: rc {rc}, wall {wall:.3f} s, first row {first if first is None else round(first, 3)} s: {' '.join(cmd)}", flush=True)
    if rc != 0:
        sys.stdout.writelines(lines[-15:])
    return {"rc": rc, "wall": wall, "first": first, "rows": rows, "text": "".join(lines)}

results = []
for i in range(1, runs + 1):
    t = run(f"nccl-tests-{i}", [theirs] + args)
    o = run(f"heddle-{i}", [agent, "bench", "nccl", coll] + args)
    results.append((t, o))
extra_runs = [run(f"heddle-extra-{i}", [agent, "bench", "nccl", coll] + args + extra)
              for i in range(1, runs + 1)] if extra else []

def ratio(a, b):
    return f"{a / b:6.3f}" if a and b else "   n/a"

print()
print("# Per size: time in us (nccl-tests / heddle) and speed ratio = t_nccl-tests / t_heddle (>1: heddle faster)")
for i, (t, o) in enumerate(results, 1):
    print(f"## run {i}")
    print(f"{'size':>12} {'oop nt':>10} {'oop heddle':>10} {'speed':>6} {'ip nt':>9} {'ip heddle':>9} {'speed':>6} wrong(nt/heddle)")
    for size in sorted(set(t["rows"]) & set(o["rows"])):
        (to, ti, tw, tw2), (oo, oi, ow, ow2) = t["rows"][size], o["rows"][size]
        print(f"{size:12d} {to:10.2f} {oo:10.2f} {ratio(to, oo)} {ti or 0:9.2f} {oi or 0:9.2f} {ratio(ti, oi)} {tw}/{tw2} {ow}/{ow2}")
print()
print(f"{'run':>4} {'wall nt (s)':>12} {'wall heddle (s)':>16} {'ratio heddle/nt':>16} {'first row nt':>13} {'first row heddle':>17} {'8 B nt':>8} {'8 B heddle':>11}")
for i, (t, o) in enumerate(results, 1):
    small = min(set(t["rows"]) & set(o["rows"]), default=None)
    print(f"{i:4d} {t['wall']:12.3f} {o['wall']:16.3f} {o['wall'] / t['wall']:16.3f} {t['first'] or 0:13.3f} {o['first'] or 0:17.3f} "
          f"{t['rows'][small][0] if small is not None else 0:8.2f} {o['rows'][small][0] if small is not None else 0:11.2f}")
for t, o in results:
    for line in o["text"].splitlines():
        if line.startswith("# Time:"):
            print(f"# heddle {line[2:]}")
for r in extra_runs:
    print(f"# heddle {' '.join(extra)}: wall {r['wall']:.3f} s, first row {r['first'] or 0:.3f} s, rc {r['rc']}")
    for line in r["text"].splitlines():
        if line.startswith("# Time:"):
            print(f"#   {line[2:]}")
bad = [r for pair in results for r in pair] + extra_runs
sys.exit(0 if all(r["rc"] == 0 for r in bad) else 1)
PY
