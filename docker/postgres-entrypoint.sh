#!/bin/sh
# Initialises $PGDATA on first start (database `heddle`, trust auth), then runs Postgres in
# the foreground as the postgres user.
set -eu
bin=/usr/lib/postgresql/15/bin
mkdir -p "$PGDATA" /run/postgresql
chown postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    su postgres -s /bin/sh -c "$bin/initdb -D '$PGDATA' -U postgres --auth=trust -E UTF8" >/dev/null
    cat >>"$PGDATA/postgresql.conf" <<CONF
listen_addresses = '*'
max_connections = 300
CONF
    echo "host all all all trust" >>"$PGDATA/pg_hba.conf"
    su postgres -s /bin/sh -c "$bin/postgres --single -D '$PGDATA' postgres" <<SQL >/dev/null
CREATE DATABASE heddle;
SQL
fi
exec su postgres -s /bin/sh -c "exec $bin/postgres -D '$PGDATA'"
