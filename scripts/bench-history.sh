#!/usr/bin/env bash
# History at scale (docs/benchmarks.md, "History at scale"): a year of nightly results of a
# fleet, generated in SQL, then the reads that must stay fast and the drop of an expired
# month, with a release heddle-server for the parts that go through it.
#
#   scripts/bench-history.sh [--nodes 10000] [--days 365] [--raw-days 365] [--rows 30] [--keep] [--reuse] [--generate-only]
#
# 1. A database of its own (heddle_bench_history) on the Postgres of scripts/pg-ensure.sh;
#    heddle-server applies the migrations.
# 2. scripts/bench-history.sql generates nodes × days results (a night in eleven skipped)
#    of `--rows` rows each, with their jobs, runs, verdicts, series points and rollups; with
#    --raw-days N only the last N days keep their full rows (as under retention), the
#    rollups cover every day.
# 3. scripts/bench-history-queries.sql: EXPLAIN ANALYZE and timings of a series' year chart,
#    its month of points, the detector's read, the open regressions list and the fleet view.
# 4. Through the server, five times each: the series' year chart (a day a point) and month
#    chart (a result a point), GET /api/v1/regressions and GET /api/v1/health.
# 5. The server again, keeping just less than the oldest month: its retention loop detaches
#    and drops that month of every raw table, and logs how long each took.
# HEDDLE_SERVER_BIN names another heddle-server binary. The database is dropped at the end
# unless --keep; --reuse skips steps 1 and 2 and reads the
# database a run with --keep left (its generation takes most of the time); --generate-only
# stops after step 2 and keeps the database (to read it later, on a quiet machine). Needs $CARGO_TARGET_DIR/release/heddle-server.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
nodes=10000 days=365 raw_days= rows=30 keep=false reuse=false generate_only=false
while [[ $# -gt 0 ]]; do
    case $1 in
        --nodes) nodes=$2; shift 2 ;;
        --days) days=$2; shift 2 ;;
        --raw-days) raw_days=$2; shift 2 ;;
        --rows) rows=$2; shift 2 ;;
        --keep) keep=true; shift ;;
        --reuse) reuse=true; keep=true; shift ;;
        --generate-only) generate_only=true; keep=true; shift ;;
        *) echo "usage: $0 [--nodes N] [--days N] [--raw-days N] [--rows N] [--keep] [--reuse] [--generate-only]" >&2; exit 2 ;;
    esac
done
raw_days=${raw_days:-$days}
server_bin=${HEDDLE_SERVER_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}/release/heddle-server}
[[ -x $server_bin ]] || { echo "$server_bin is missing: cargo build --release -p heddle-server" >&2; exit 1; }
admin_url=$(scripts/pg-ensure.sh)
db=heddle_bench_history
url="${admin_url%/*}/$db"
token=hdl_bench-history-admin-token-0000000000000000000000
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp -d)/server.log
step() { printf '\n== bench-history: %s (%s)\n' "$*" "$(date -u +%T)"; }

server_pid=
start_server() { # HEDDLE_HISTORY_KEEP_DAYS
    HEDDLE_DATABASE_URL=$url HEDDLE_LISTEN=127.0.0.1:$port HEDDLE_ADMIN_TOKEN=$token \
        HEDDLE_HISTORY_KEEP_DAYS=$1 HEDDLE_ROLLUP_KEEP_DAYS=0 HEDDLE_LOG=info,sqlx=warn \
        "$server_bin" >>"$log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
        sleep 0.5
    done
    echo "heddle-server did not become ready; its log:" >&2; tail -n 30 "$log" >&2; exit 1
}
stop_server() { [[ -n $server_pid ]] && kill "$server_pid" && wait "$server_pid" || true; server_pid=; }
cleanup() {
    stop_server
    if [[ $keep == false ]]; then psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true; fi
}
trap cleanup EXIT

if [[ $reuse == false ]]; then
    # About 190 bytes a result row (its heap tuple and primary key entry), 1.6 KB a result (its
    # job, verdict, point and their indexes), 230 bytes a rollup; refuse to fill the disk.
    need_gib=$(( (nodes * raw_days * (rows * 190 + 1600) + nodes * days * 230) / 1000000000 + 1 ))
    free_gib=$(df -BG --output=avail "$repo" | tail -n 1 | tr -dc 0-9)
    if (( free_gib < need_gib + 10 )); then
        echo "about $need_gib GiB needed and $free_gib GiB free: leaving less than 10 GiB; use fewer --nodes, --days or --rows" >&2
        exit 1
    fi
    echo "about $need_gib GiB for the database; $free_gib GiB free"

    step "database $db, migrated by heddle-server"
    psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    start_server 0
    stop_server

    step "generate: $nodes nodes x $days nights (the last $raw_days with full rows) x $rows rows"
    start=$(date +%s)
    psql -q "$url" -v nodes="$nodes" -v days="$days" -v raw_days="$raw_days" -v nrows="$rows" -f scripts/bench-history.sql
    echo "generated in $(( $(date +%s) - start )) s"
    if [[ $generate_only == true ]]; then
        echo "kept $db; read it with: $0 --reuse --rows $rows"
        exit 0
    fi

fi

node=$(psql -Atq "$url" -c "SELECT id FROM nodes ORDER BY hostname = 'bench-04242' DESC, hostname LIMIT 1")
band=$(( 20 + (rows - 1) / 2 ))
step "reads (node $node, band $band)"
psql -q "$url" -v node="$node" -v band="$band" -f scripts/bench-history-queries.sql

step "through the server: a series' year and month charts, GET /api/v1/regressions and GET /api/v1/health (seconds)"
start_server 0
series="/api/v1/regressions/series?node=$node&test=nccl.all_reduce&metric=busbw_gbs&band=$band&world_size=1"
year_ago=$(date -u -d '365 days ago' +%Y-%m-%dT%H:%M:%SZ)
month_ago=$(date -u -d '30 days ago' +%Y-%m-%dT%H:%M:%SZ)
for path in "$series&since=$year_ago" "$series&since=$month_ago" "/api/v1/regressions?limit=1000" /api/v1/health; do
    for _ in 1 2 3 4 5; do
        curl -sf -o /dev/null -w "$path %{time_total}\n" -H "authorization: Bearer $token" "http://127.0.0.1:$port$path"
    done
done
stop_server

step "retention: the oldest month expires"
oldest=$(psql -Atq "$url" -c "SELECT min(received_at) FROM results")
keep_days=$(psql -Atq "$url" -c "SELECT current_date - (date_trunc('month', '$oldest'::timestamptz AT TIME ZONE 'UTC') + interval '1 month')::date")
psql -q "$url" -c "SELECT c.relname AS partition, c.reltuples::bigint AS rows, pg_size_pretty(pg_total_relation_size(c.oid)) AS size
    FROM pg_class c WHERE c.relname IN (SELECT name FROM unnest(history_tables()) t,
        history_expired_partitions(t, current_date - $keep_days)) ORDER BY 1"
: >"$log"
start_server "$keep_days"
for _ in $(seq 1 120); do
    [[ $(grep -c 'dropped an expired month' "$log" || true) -ge 4 ]] && break
    sleep 0.5
done
stop_server
grep 'dropped an expired month' "$log" | sed 's/\x1b\[[0-9;]*m//g'
psql -q "$url" -c "SELECT count(*) AS results_left, min(received_at) AS oldest_left FROM results"
psql -q "$url" -c "SELECT pg_size_pretty(pg_database_size(current_database())) AS database_size"
