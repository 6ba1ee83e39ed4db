# Hung and straggling PyTorch jobs named while they happen (sourced by device-e2e.sh
# --hang, after its set-up: Postgres, the server, agent 0 reading the default job spool).
#
# The plugins are installed as docs/jobs.md tells an admin: the environment plugin on the
# loader path as libnccl-env.so, agent 0 naming the profiler in the node env file it keeps
# at the plugin's default path. Each scenario is a real DDP job (scripts/device/hang_job.py)
# under torchrun, two ranks on GPU 0, each its own NCCL_HOSTID (a "two-host" job over
# sockets), with no Heddle variable in its environment:
#   a  rank 1 stopped with SIGSTOP at step 10 (continued after 45 s)
#   b  rank 1 sleeping 60 s in Python at step 10
#   c  rank 1 150 ms late to every step
#   d  every rank pausing 90 s at step 10
#   e  the ranks given different NCCL_ALGO by the job itself
#   f  the ranks given different NCCL_PROTO by the job itself
# For each: the verdict and reasons `heddle workloads ls` shows, polled every second from the
# fault, the first time a job-hung / job-straggler reason appeared, and `heddle workloads show`.
# HEDDLE_HANG_SCENARIOS picks some of them by letter, in the order given ("a b c"; all five
# by default), so a machine whose commands are time-limited can run them in two goes;
# HEDDLE_HANG_STEPS sets the jobs' steps (400).

hang_libdir=/opt/heddle/lib

hang_install() { # PLUGIN_DIR
    local dir=$1
    [[ -s "$dir/libnccl-env-heddle.so" && -s "$dir/libnccl-profiler-heddle.so" ]] ||
        die "$dir lacks libnccl-env-heddle.so or libnccl-profiler-heddle.so"
    install -d -m 755 "$hang_libdir"
    install -m 644 "$dir/libnccl-env-heddle.so" "$dir/libnccl-profiler-heddle.so" "$hang_libdir/"
    ln -sf "$hang_libdir/libnccl-env-heddle.so" "$hang_libdir/libnccl-env.so"
    echo "$hang_libdir" >/etc/ld.so.conf.d/heddle.conf && ldconfig
}

# The job's ids in `heddle --json workloads ls` (one per node row), newest first.
hang_job_line() { # SINCE_EPOCH
    python3 - "$logs/hang-ls.json" "$1" <<'PY'
import json, sys, datetime
doc = json.load(open(sys.argv[1]))
since = float(sys.argv[2])
for j in doc:
    first = datetime.datetime.fromisoformat(j["first_seen_at"].replace("Z", "+00:00")).timestamp()
    if first < since - 5:
        continue
    codes = [r.get("code") for r in j.get("reasons", [])]
    flag = next((c for c in codes if c in ("job-hung", "job-straggler", "job-rank-silent")), "-")
    msg = next((r["message"] for r in j.get("reasons", []) if r.get("code") == flag), "")
    print(f"{j['id']}\t{flag}\t{j['verdict']}\t{msg}")
    break
PY
}

hang_scenario() { # NAME FAULT
    local name=$1 fault=$2 started fault_at="" rank1="" flag_at="" line="" id="" i
    started=$(date +%s.%N)
    env -u HEDDLE_PROFILER_SPOOL -u NCCL_PROFILER_PLUGIN -u NCCL_ENV_PLUGIN FAULT="$fault" STEPS=${HEDDLE_HANG_STEPS:-400} \
        LD_LIBRARY_PATH="$hang_nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV \
        CUDA_VISIBLE_DEVICES=0 setsid python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        "$repo/scripts/device/hang_job.py" >"$logs/hang-$name.log" 2>&1 &
    local job=$!
    # The fault's moment: rank 1 reaches step 10 (where b and d sleep, a is stopped); for e and f
    # it is the start (the ranks disagree from their first collective).
    [[ $fault == algo || $fault == proto ]] || for i in $(seq 1 1200); do
        grep -q "rank 1 fault point" "$logs/hang-$name.log" && break
        kill -0 "$job" 2>/dev/null || break
        sleep 0.1
    done
    rank1=$(sed -n 's/^.*rank 1 pid \([0-9]*\).*$/\1/p' "$logs/hang-$name.log" | head -1)
    [[ $fault == sigstop && -n "$rank1" ]] && kill -STOP "$rank1"
    fault_at=$(date +%s.%N)
    for i in $(seq 1 120); do
        t 30 "$bin/heddle" --json workloads ls --node "$node0" >"$logs/hang-ls.json" 2>>"$logs/cli.log" &&
            line=$(hang_job_line "$started")
        if [[ -n "$line" && -z "$flag_at" && $(cut -f2 <<<"$line") != "-" ]]; then
            flag_at=$(date +%s.%N)
            id=$(cut -f1 <<<"$line")
            say "  $name: $(cut -f2,3 <<<"$line") $(secs "$fault_at" "$flag_at") s after the fault: $(cut -f4 <<<"$line")"
            t 30 "$bin/heddle" workloads show "$id" >"$logs/hang-$name-show.txt" 2>&1
            sed -n '/^ranks:/,$p' "$logs/hang-$name-show.txt" | while read -r l; do say "    $l"; done
            break
        fi
        [[ $fault == sigstop ]] && ((i == 45)) && kill -CONT "$rank1"
        kill -0 "$job" 2>/dev/null || break
        sleep 1
    done
    [[ -n "$rank1" ]] && kill -CONT "$rank1" 2>/dev/null
    [[ -z "$flag_at" ]] && say "  $name: no hung/straggler reason within 120 s; last: $(cut -f2,3 <<<"$line")"
    # Ranks that disagree on NCCL_ALGO or NCCL_PROTO may never finish by themselves (PyTorch's watchdog would
    # end them after 10 minutes): once judged, the job is ended here.
    [[ $fault == algo || $fault == proto ]] && { kill -- -"$job" 2>/dev/null; sleep 2; }
    # Whatever it does now, the next scenario needs the GPU.
    t 200 tail --pid="$job" -f /dev/null 2>/dev/null || { kill -- -"$job" 2>/dev/null; sleep 2; }
    hang_lines+=("$name ${fault}: ${flag_at:+$(secs "$fault_at" "$flag_at") s }$(cut -f2,3 <<<"$line")")
}

hang_checks() { # PLUGIN_DIR
    begin "hang install"
    hang_install "$1"
    hang_nccl_lib=$(python3 -c "import os, nvidia.nccl as n; print(os.path.join(os.path.dirname(n.__file__), 'lib'))" 2>/dev/null) ||
        hang_nccl_lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
    # Agent 0 writes the node env file (naming the profiler) at the plugin's default path.
    for _ in $(seq 1 60); do grep -q NCCL_PROFILER_PLUGIN /var/lib/heddle-agent/nccl.env 2>/dev/null && break; sleep 0.5; done
    grep -q NCCL_PROFILER_PLUGIN /var/lib/heddle-agent/nccl.env || surprise "the node env file does not name the profiler"
    end "plugins in $hang_libdir, node env file $(sha256sum /var/lib/heddle-agent/nccl.env | cut -c1-12)"
    hang_lines=()
    local s
    local -A faults=([a]=sigstop [b]=sleep [c]=slow [d]=pause [e]=algo [f]=proto)
    for s in ${HEDDLE_HANG_SCENARIOS:-a b c d e f}; do
        [[ -n "${faults[$s]:-}" ]] || { surprise "no hang scenario $s (a to f)"; continue; }
        begin "hang $s"
        hang_scenario "$s" "${faults[$s]}"
        end "${hang_lines[-1]}"
    done
    grep -h "PROFILER/Plugin\|ENV/Plugin: Using" "$logs"/hang-*.log | sort | uniq -c | head -5 | while read -r l; do say "  $l"; done
}
