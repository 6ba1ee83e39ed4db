#!/usr/bin/env bash
# Stops what scripts/up.sh started (agent, server, and the project-local Postgres).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
state="$repo/.heddle"
for p in agent server; do
    if [[ -s "$state/$p.pid" ]] && kill -0 "$(cat "$state/$p.pid")" 2>/dev/null; then
        kill "$(cat "$state/$p.pid")" && echo "stopped $p"
    fi
    rm -f "$state/$p.pid"
done
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
data=$(cat "$state/pg-data-path" 2>/dev/null || echo "$state/pg")
if [[ -f "$data/postmaster.pid" ]]; then
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$bindir/pg_ctl" -D "$data" stop -m fast; else "$bindir/pg_ctl" -D "$data" stop -m fast; fi
fi
