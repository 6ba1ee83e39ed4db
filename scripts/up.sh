#!/usr/bin/env bash
# Brings Heddle up on this machine: installs what is missing (scripts/setup.sh), then
# Postgres (a project-local cluster when none answers), the server with the dashboard, and
# an agent for this host. Waits until this host's node is registered, then prints the
# dashboard URL and the admin token. Needs Debian 12 with rustup.
# Stop everything with scripts/down.sh. Safe to run again: running parts are kept.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
state="$repo/.heddle"
mkdir -p "$state"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/heddle-target}
profile=${HEDDLE_PROFILE:-dev}
bindir="$CARGO_TARGET_DIR/$([[ $profile == dev ]] && echo debug || echo "$profile")"
listen=${HEDDLE_LISTEN:-127.0.0.1:8080}
url="http://$listen"

scripts/setup.sh

pg=$(scripts/pg-ensure.sh)
db_url="${pg%/*}/heddle"
if ! psql "$pg" -tAc "SELECT 1 FROM pg_database WHERE datname = 'heddle'" | grep -q 1; then
    psql "$pg" -qc "CREATE DATABASE heddle" >/dev/null
fi

echo "up.sh: building plugins, dashboard and binaries (profile $profile)..." >&2
scripts/build-plugins.sh >&2
scripts/build-frontend.sh >&2
cargo build --profile "$profile" -p heddle-server -p heddle-agent -p heddle-cli >&2

if [[ ! -s "$state/admin-token" ]]; then
    umask 077
    printf 'hdl_%s\n' "$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')" >"$state/admin-token"
fi
admin=$(cat "$state/admin-token")

alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

if ! alive "$state/server.pid"; then
    HEDDLE_DATABASE_URL="$db_url" HEDDLE_LISTEN="$listen" HEDDLE_ADMIN_TOKEN="$admin" \
    HEDDLE_DASHBOARD_DIR=${HEDDLE_DASHBOARD_DIR:-$repo/frontend/dist} \
        setsid "$bindir/heddle-server" >>"$state/server.log" 2>&1 < /dev/null &
    echo $! >"$state/server.pid"
fi
for _ in $(seq 1 100); do
    curl -fsS "$url/readyz" >/dev/null 2>&1 && break
    alive "$state/server.pid" || { tail -n 20 "$state/server.log" >&2; echo "up.sh: the server stopped; see $state/server.log" >&2; exit 1; }
    sleep 0.2
done

export HEDDLE_URL="$url" HEDDLE_TOKEN="$admin" HEDDLE_CONFIG="$state/cli.json"
# The agent keeps its credential in identity.json; without one it enrolls with a fresh
# single-use token.
start_agent() {
    local enroll=""
    if [[ ! -s "$state/agent/identity.json" ]]; then
        enroll=$("$bindir/heddle" agents enroll-token --max-uses 1 2>/dev/null)
    fi
    mkdir -p "$state/agent"
    HEDDLE_URL="$url" HEDDLE_ENROLL_TOKEN="$enroll" HEDDLE_STATE_DIR="$state/agent" \
        setsid "$bindir/heddle-agent" run >>"$state/agent.log" 2>&1 < /dev/null &
    echo $! >"$state/agent.pid"
}
alive "$state/agent.pid" || start_agent

# The local node is up once the agent enrolled and sent its facts. An agent whose stored
# credential this server does not know (its database was made anew) enrolls again, once:
# the old identity is kept beside as identity.json.refused.
host=$(hostname)
again=1
for i in $(seq 1 120); do
    curl -fsS -H "authorization: Bearer $admin" "$url/api/v1/nodes/$host" 2>/dev/null | grep -q '"facts_updated_at":"' && break
    if ! alive "$state/agent.pid"; then
        if ((again)) && tail -n 5 "$state/agent.log" | grep -q "refused this agent's credential"; then
            again=0
            echo "up.sh: the server does not know this host's stored agent credential; enrolling again" >&2
            mv -f "$state/agent/identity.json" "$state/agent/identity.json.refused"
            start_agent
            continue
        fi
        tail -n 20 "$state/agent.log" >&2; echo "up.sh: the agent stopped; see $state/agent.log" >&2; exit 1
    fi
    [[ $i == 120 ]] && { echo "up.sh: node $host did not register within 60 s; see $state/agent.log" >&2; exit 1; }
    sleep 0.5
done

cat <<MSG
Heddle is up.
  dashboard:    $url/
  local node:   $host
  API document: $url/api/v1/openapi.json
  admin token:  $admin
  CLI:          export HEDDLE_URL=$url HEDDLE_TOKEN=$admin; $bindir/heddle nodes ls
  logs:         $state/server.log, $state/agent.log
  stop:         scripts/down.sh
MSG
