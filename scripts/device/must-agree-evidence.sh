#!/usr/bin/env bash
# What a differing NCCL variable does to a two-rank communicator, measured: for each
# candidate of heddle_types::must_agree, two single-GPU processes (scripts/device/mismatch.py,
# torch.distributed) run a few all_reduces and a send/recv with the variable set in rank 1's
# environment only, each case bounded by a timeout; a table says ran / hung / error and the
# bandwidth. NCCL_HOSTID differs per rank so NCCL treats them as two nodes (network
# transport between them, as between two machines); NCCL_NVLS_ENABLE=0 is kept on both.
#
# Usage: scripts/device/must-agree-evidence.sh [NCCL_TESTS_BUILD_DIR] [--same-host]
#   NCCL_TESTS_BUILD_DIR  optional; its all_reduce_perf -g 2 gives a single-process baseline
#   --same-host           keep both ranks on one host (P2P/SHM between them)
# Needs two GPUs, python3 with torch (CUDA). Each case takes at most CASE_TIMEOUT (20 s).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
tests_dir=""
two_hosts=1
for arg in "$@"; do
    case "$arg" in
        --same-host) two_hosts=0 ;;
        *) tests_dir=$arg ;;
    esac
done
CASE_TIMEOUT=${CASE_TIMEOUT:-20}
PY=${PYTHON:-python3}

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)' 2>/dev/null; then
    echo "needs python3 with torch and at least two CUDA devices" >&2
    exit 2
fi

export NCCL_NVLS_ENABLE=0
unset NCCL_DEBUG

# variable  value-on-rank-1  (rank 0 leaves it unset)
cases=(
    "- -"
    "NCCL_MAX_NCHANNELS 1"
    "NCCL_MIN_NCHANNELS 8"
    "NCCL_MAX_CTAS 1"
    "NCCL_ALGO Tree"
    "NCCL_PROTO LL"
    "NCCL_BUFFSIZE 1048576"
    "NCCL_LL128_BUFFSIZE 65536"
    "NCCL_NTHREADS 128"
    "NCCL_P2P_NET_CHUNKSIZE 32768"
    "NCCL_NCHANNELS_PER_NET_PEER 1"
    "NCCL_PXN_DISABLE 1"
    "NCCL_CROSS_NIC 1"
    "NCCL_NET_GDR_LEVEL LOC"
    "NCCL_P2P_DISABLE 1"
    "NCCL_P2P_LEVEL LOC"
    "NCCL_SHM_DISABLE 1"
    "NCCL_COLLNET_ENABLE 1"
    "NCCL_IB_DISABLE 1"
    "NCCL_NET Socket"
    "=NCCL_MAX_NCHANNELS 1"
)

if [[ -n "$tests_dir" && -x "$tests_dir/all_reduce_perf" ]]; then
    echo "# baseline: $tests_dir/all_reduce_perf -g 2 (one process)"
    timeout "$CASE_TIMEOUT" "$tests_dir/all_reduce_perf" -b 64M -e 64M -g 2 -n 5 -w 2 2>&1 | grep -E '^ +[0-9]|Avg bus' || echo "(all_reduce_perf failed)"
fi

port=$((29500 + RANDOM % 1000))
printf '%-30s %-10s %-7s %-12s %-12s %s\n' VARIABLE RANK1 RESULT "1MiB GB/s" "64MiB GB/s" DETAIL
for case in "${cases[@]}"; do
    read -r name value <<<"$case"
    both=0
    if [[ $name == =* ]]; then both=1; name=${name#=}; fi
    port=$((port + 1))
    out=$(mktemp -d)
    env0=(); env1=()
    if [[ $two_hosts == 1 ]]; then env0+=(NCCL_HOSTID=heddle-a); env1+=(NCCL_HOSTID=heddle-b); fi
    if [[ $name != - ]]; then
        env1+=("$name=$value")
        if [[ $both == 1 ]]; then env0+=("$name=$value"); fi
    fi
    started=$(date +%s.%N)
    env "${env0[@]}" timeout -k 2 "$CASE_TIMEOUT" "$PY" "$here/mismatch.py" --rank 0 --port "$port" --timeout $((CASE_TIMEOUT - 3)) >"$out/0" 2>"$out/0.err" &
    p0=$!
    env "${env1[@]}" timeout -k 2 "$CASE_TIMEOUT" "$PY" "$here/mismatch.py" --rank 1 --port "$port" --timeout $((CASE_TIMEOUT - 3)) >"$out/1" 2>"$out/1.err" &
    p1=$!
    wait "$p0"; r0=$?
    wait "$p1"; r1=$?
    took=$(echo "$(date +%s.%N) - $started" | bc)
    result=ran
    if [[ $r0 == 124 || $r1 == 124 ]]; then result=hung; elif [[ $r0 != 0 || $r1 != 0 ]]; then result=error; fi
    read -r bw1 bw64 detail < <("$PY" - "$out/0" "$out/1" <<'PYEOF'
import json, sys
lines = []
for p in sys.argv[1:]:
    try:
        lines.append(json.loads(open(p).read().strip().splitlines()[-1]))
    except Exception:
        lines.append({})
bw = lines[0].get("busbw_gbs", {})
detail = "; ".join(
    f"r{i}:{l.get('status', '?')}@{l.get('stage', '?')}" + (f" {l['error']}" if l.get("error") else "")
    for i, l in enumerate(lines)
)
print(bw.get("1048576", "-"), bw.get("67108864", "-"), detail.replace("\n", " ")[:200])
PYEOF
)
    label=$name; [[ $both == 1 ]] && label="$name (both ranks)"; [[ $name == - ]] && label="(no difference)"
    printf '%-30s %-10s %-7s %-12s %-12s %s (%.1f s)\n' "$label" "${value}" "$result" "$bw1" "$bw64" "$detail" "$took"
    rm -rf "$out"
done
