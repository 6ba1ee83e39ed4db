#!/usr/bin/env bash
# Observed workloads' statements at scale (docs/benchmarks.md, "Observed workloads"):
# 10,000 nodes × 5 kept jobs (four Slurm jobs shared by 100-node groups and one `pid:` job
# every node reuses) × 16 communicator rows, generated in SQL, then the statements the
# upload and the lists run, prepared as sqlx prepares them (so after five runs Postgres may
# switch to a generic plan), with their median and worst times in ms.
#
#   scripts/bench-observed.sh [--nodes 10000]
#
# A database of its own (heddle_bench_observed) on the Postgres of scripts/pg-ensure.sh,
# migrated with sqlx-cli (scripts/setup.sh --test installs it), dropped at the end.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
nodes=10000
[[ ${1:-} == --nodes ]] && nodes=$2
base=$(scripts/pg-ensure.sh)
url="${base%/*}/heddle_bench_observed"
export DATABASE_URL=$url
sqlx database drop -y >/dev/null 2>&1 || true
sqlx database create
trap 'sqlx database drop -y >/dev/null 2>&1 || true' EXIT
sqlx migrate run --source migrations >/dev/null
psql -q -v ON_ERROR_STOP=1 "$url" <<SQL
INSERT INTO nodes (id, hostname) SELECT gen_random_uuid(), 'n' || i FROM generate_series(1, $nodes) i;
INSERT INTO observed_jobs (node_id, job_key, source, uid, last_seen_at)
SELECT n.id, 'slurm:' || ((row_number() OVER (ORDER BY n.hostname) - 1) / 100 * 10 + k), 'profiler', 1000,
       now() - random() * interval '1 day'
FROM nodes n, generate_series(1, 4) k;
INSERT INTO observed_jobs (node_id, job_key, source, uid, last_seen_at)
SELECT n.id, 'pid:500@7', 'profiler', 1000, now() - random() * interval '1 day' FROM nodes n;
INSERT INTO observed_comms (job_id, pid, start_ticks, comm_hash, seq, is_final, written_at, nranks, nnodes, rank, ops, net, finalized)
SELECT j.id, p, 1, 'c' || c, 1, false, now(), 800, 100, 0, '[]', '[]', false
FROM observed_jobs j, generate_series(1, 8) p, generate_series(1, 2) c;
VACUUM ANALYZE;
SQL
setup=$(mktemp)
cat >"$setup" <<'SQL'
\set QUIET on
SELECT id AS sid, node_id AS snode FROM observed_jobs WHERE job_key = 'slurm:51' LIMIT 1 \gset
SELECT id AS pidj FROM observed_jobs WHERE job_key = 'pid:500@7' LIMIT 1 \gset
-- observed/store.rs: the rows a job's group holds, less the uploading process's own.
PREPARE held(uuid, bigint, bigint) AS
 SELECT count(*) FROM observed_comms c JOIN observed_jobs j ON j.id = c.job_id
   JOIN observed_jobs me ON (me.job_key, me.uid, me.scope) = (j.job_key, j.uid, j.scope)
 WHERE me.id = $1 AND NOT (c.job_id = $1 AND c.pid = $2 AND c.start_ticks = $3);
-- observed/store.rs: summaries! for one job, a node's page and a page of every job.
PREPARE one(uuid) AS SELECT * FROM observed_job_summaries WHERE id = $1;
PREPARE node_page(uuid, timestamptz, uuid, bigint, text) AS SELECT * FROM observed_job_summaries
 WHERE node_id = $1 AND ($5::text IS NULL OR slurm_job_id = $5)
   AND ($2::timestamptz IS NULL OR (last_seen_at, id) < ($2, $3))
 ORDER BY last_seen_at DESC, id DESC LIMIT $4;
PREPARE page(timestamptz, uuid, bigint) AS SELECT * FROM observed_job_summaries
 WHERE ($1::timestamptz IS NULL OR (last_seen_at, id) < ($1, $2))
 ORDER BY last_seen_at DESC, id DESC LIMIT $3;
\timing on
\o /dev/null
SQL
time_it() { # name, statement, runs
    { cat "$setup"; for _ in $(seq 1 "$3"); do echo "$2"; done; } | psql -q "$url" 2>&1 |
        awk '/^Time:/ {print $2}' | sort -n |
        awk -v n="$1" '{a[NR] = $1} END {printf "%-38s median %8.3f ms  worst %8.3f ms  (%d runs)\n", n, a[int((NR + 1) / 2)], a[NR], NR}'
}
echo "observed workloads: $nodes nodes, $((nodes * 5)) jobs, $((nodes * 80)) communicator rows"
time_it "held rows, a Slurm job of 100 nodes" "EXECUTE held(:'sid', 1, 1);" 200
time_it "held rows, a pid: job on every node" "EXECUTE held(:'pidj', 1, 1);" 200
time_it "summary of one job" "EXECUTE one(:'sid');" 100
time_it "a node's page of 51" "EXECUTE node_page(:'snode', NULL, NULL, 51, NULL);" 100
time_it "the first page of 51, no filter" "EXECUTE page(NULL, NULL, 51);" 100
rm -f "$setup"
