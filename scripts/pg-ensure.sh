#!/usr/bin/env bash
# Makes sure a Postgres server is reachable and prints its URL on stdout.
#
# Uses $HEDDLE_PG_URL when it answers; otherwise starts (once) a project-local cluster in
# .heddle/pg with the binaries of Debian's postgresql package, listening on 127.0.0.1 only.
# Postgres refuses to run as root, so under root the cluster belongs to the `postgres` user.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
port=${HEDDLE_PG_PORT:-54329}
url_default="postgres://postgres@127.0.0.1:${port}/postgres"
url=${HEDDLE_PG_URL:-$url_default}

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [[ -z "$bindir" ]]; then
    echo "pg-ensure: no PostgreSQL binaries under /usr/lib/postgresql (apt-get install postgresql)" >&2
    exit 1
fi

ready() { "$bindir/pg_isready" -q -d "$1" >/dev/null 2>&1; }

if ready "$url"; then
    echo "$url"
    exit 0
fi
if [[ "$url" != "$url_default" ]]; then
    echo "pg-ensure: HEDDLE_PG_URL=$url does not answer" >&2
    exit 1
fi

mkdir -p "$repo/.heddle"
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}
# Project-local when the cluster's owner can reach the checkout (under root it is the
# postgres user, who cannot enter e.g. /root); otherwise under the postgres user's home.
data=${HEDDLE_PG_DATA:-$repo/.heddle/pg}
if [[ -z "${HEDDLE_PG_DATA:-}" && $(id -u) -eq 0 ]] && ! runuser -u postgres -- test -x "$repo/.heddle"; then
    data="$(getent passwd postgres | cut -d: -f6)/heddle-$port"
fi
echo "$data" >"$repo/.heddle/pg-data-path"
if [[ ! -f "$data/PG_VERSION" ]]; then
    mkdir -p "$data"
    if [[ $(id -u) -eq 0 ]]; then chown postgres: "$data"; fi
    chmod 700 "$data"
    as_owner "$bindir/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >"$repo/.heddle/initdb.log" 2>&1 \
        || { cat "$repo/.heddle/initdb.log" >&2; exit 1; }
    cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = ''
max_connections = 500
shared_buffers = 256MB
fsync = on
CONF
fi
as_owner "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start >/dev/null \
    || { tail -n 30 "$data/server.log" >&2; exit 1; }
for _ in $(seq 1 60); do
    if ready "$url"; then echo "$url"; exit 0; fi
    sleep 0.5
done
echo "pg-ensure: Postgres did not become ready; see $data/server.log" >&2
exit 1
