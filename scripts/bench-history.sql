-- History at scale, generated in SQL (scripts/bench-history.sh runs this on a database with
-- the migrations applied; docs/benchmarks.md, "History at scale"). A fleet of :nodes nodes
-- runs one nightly all_reduce each for :days days (a node skips about one night in eleven);
-- each result has :nrows rows (nccl-tests' sizes from 1 MiB up, out of place and in place),
-- its verdict, its series point and its day's rollup, as the server writes them. One node in
-- fifty loses 7 % at a day of its own and has an open regression.
--
-- Only the last :raw_days days have their full rows (results, rows, verdicts, points, jobs,
-- runs), as a database under retention does; the rollups cover every day. Ids are
-- time-ordered (kind, day, node) rather than random, so that the generation appends to its
-- indexes; the server's are random v4 ids. Variables: nodes, days, raw_days, nrows.

\set ON_ERROR_STOP on
SET synchronous_commit = off;
SET work_mem = '256MB';

CREATE FUNCTION pg_temp.bench_id(kind int, a int, b int) RETURNS uuid
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT (lpad(to_hex(kind), 2, '0') || lpad(to_hex(a), 6, '0') || lpad(to_hex(b), 24, '0'))::uuid $$;

-- The day the first night falls in: day d is :days - d days ago.
CREATE TABLE pg_temp.bench_settings AS
SELECT (date_trunc('day', now()) - make_interval(days => :days)) AS t0, :nodes::int AS nodes, :nrows::int AS nrows,
       greatest(:days - :raw_days, 0) AS raw_from;

-- Node n's level and, for one node in fifty, the day it drops 7 %.
CREATE FUNCTION pg_temp.bench_value(d int, n int) RETURNS double precision
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT 360.0 * (0.97 + 0.06 * ((n * 0.6180339887) - floor(n * 0.6180339887)))
              * (1.0 + 0.02 * (((d * 31 + n * 17)::bigint * 2654435761 % 1000) / 1000.0 - 0.5))
              * CASE WHEN n % 50 = 7 AND d >= 100 + n % 200 THEN 0.93 ELSE 1.0 END $$;

CREATE PROCEDURE pg_temp.bench_chunk(d0 int, d1 int)
    LANGUAGE plpgsql AS $$
DECLARE
    s record;
    started timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO s FROM pg_temp.bench_settings;
    CREATE TEMP TABLE nd ON COMMIT DROP AS
    SELECT d, n, s.t0 + make_interval(days => d, mins => n % 1440, secs => n / 1440) AS ts,
           pg_temp.bench_value(d, n) AS v
    FROM generate_series(d0, d1 - 1) d, generate_series(0, s.nodes - 1) n
    WHERE (n * 7919 + d * 104729) % 11 <> 0;
    -- The headline figure: busbw at the largest size.
    CREATE TEMP TABLE fig ON COMMIT DROP AS
    SELECT d, n, ts, v * (1 - exp(-((s.nrows - 1) / 2 + 1) / 3.0)) AS value, 20 + (s.nrows - 1) / 2 AS band FROM nd;

    INSERT INTO series_daily (node_id, test, metric, band, world_size, pair, day, n, sum, min, max, median, recent)
    SELECT pg_temp.bench_id(4, 0, n), 'nccl.all_reduce', 'busbw_gbs', band, 1, '', (ts AT TIME ZONE 'UTC')::date,
           1, value, value, value, value, ARRAY[value]
    FROM fig;
    DELETE FROM nd WHERE d < s.raw_from;
    DELETE FROM fig WHERE d < s.raw_from;

    INSERT INTO runs (id, label, spec, created_by, created_at)
    SELECT pg_temp.bench_id(3, d, b), 'nightly', '{"kind": "nccl", "params": {"op": "all_reduce"}}', 'bench',
           s.t0 + make_interval(days => d)
    FROM generate_series(greatest(d0, s.raw_from), d1 - 1) d, generate_series(0, (s.nodes - 1) / 1000) b;

    INSERT INTO jobs (id, run_id, node_id, rank, world_size, state, attempts, max_attempts, created_at,
                      started_at, finished_at)
    SELECT pg_temp.bench_id(2, d, n), pg_temp.bench_id(3, d, n / 1000), pg_temp.bench_id(4, 0, n), n % 1000, 1,
           'succeeded', 1, 1, ts - interval '2 minutes', ts - interval '1 minute', ts
    FROM nd;

    INSERT INTO results (id, job_id, upload_key, outcome, summary, started_at, finished_at, received_at)
    SELECT pg_temp.bench_id(1, d, n), pg_temp.bench_id(2, d, n), 'bench-' || d || '-' || n, 'succeeded',
           '{"nranks": 8, "nccl_network": "IB"}', ts - interval '1 minute', ts, ts
    FROM nd;

    -- Sizes 1 MiB, 2 MiB, ... each out of place and in place; bus bandwidth rising to the level.
    INSERT INTO result_rows (result_id, seq, size_bytes, count, dtype, op, in_place, time_us, algbw_gbs, busbw_gbs,
                             wrong, received_at)
    SELECT pg_temp.bench_id(1, d, n), q, 1::bigint << (20 + q / 2), (1::bigint << (20 + q / 2)) / 4, 'float',
           'all_reduce', q % 2 = 1,
           (1::bigint << (20 + q / 2)) / (v * (1 - exp(-(q / 2 + 1) / 3.0)) * 1e3 * 8 / 14.0),
           v * (1 - exp(-(q / 2 + 1) / 3.0)) * 8 / 14.0, v * (1 - exp(-(q / 2 + 1) / 3.0)), 0, ts
    FROM nd, generate_series(0, s.nrows - 1) q;

    INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, reasons, metric, value, judged_at, figures,
                          world_size, gpu_model, received_at)
    SELECT pg_temp.bench_id(1, d, n), pg_temp.bench_id(3, d, n / 1000), pg_temp.bench_id(4, 0, n), 'nccl.all_reduce',
           'pass', '[]', 'busbw_gbs', value, ts + interval '1 second',
           jsonb_build_array(jsonb_build_object('test', 'nccl.all_reduce', 'metric', 'busbw_gbs',
                                                'size_bytes', 1::bigint << band, 'band', band, 'value', value)),
           1, 'NVIDIA H100 80GB HBM3', ts
    FROM fig;

    INSERT INTO series_points (node_id, test, metric, band, world_size, pair, t, value, result_id)
    SELECT pg_temp.bench_id(4, 0, n), 'nccl.all_reduce', 'busbw_gbs', band, 1, '', ts, value, pg_temp.bench_id(1, d, n)
    FROM fig;
    RAISE NOTICE 'days % to %: % results with rows in %', d0, d1 - 1, (SELECT count(*) FROM nd), clock_timestamp() - started;
END $$;

\timing on
SELECT history_ensure_partitions((SELECT t0 FROM pg_temp.bench_settings)::date,
                                 (current_date + interval '3 months')::date) AS partitions_created;

INSERT INTO nodes (id, hostname, gpu_model, gpu_count, last_seen_at)
SELECT pg_temp.bench_id(4, 0, n), 'bench-' || lpad(n::text, 5, '0'), 'NVIDIA H100 80GB HBM3', 8, now()
FROM generate_series(0, :nodes - 1) n;

-- A month a transaction.
SELECT format('CALL pg_temp.bench_chunk(%s, %s)', d, least(d + 30, :days))
FROM generate_series(0, :days - 1, 30) d \gexec

INSERT INTO latest_verdicts (node_id, test, result_id, run_id, verdict, reasons, metric, value, judged_at, figures,
                             world_size, gpu_model, received_at)
SELECT DISTINCT ON (node_id, test) node_id, test, result_id, run_id, verdict, reasons, metric, value, judged_at,
       figures, world_size, gpu_model, received_at
FROM verdicts WHERE received_at > now() - interval '3 days' ORDER BY node_id, test, judged_at DESC;

-- The regressed nodes' open change points, at their first night after the drop (the
-- rollups have every night; a change's result may be older than the full rows).
INSERT INTO change_points (id, node_id, test, metric, size_band, world_size, pair, result_id, t, before, after,
                           relative_change, ci_low, ci_high, points_before, points_after, worse, latest)
SELECT gen_random_uuid(), r.node_id, r.test, r.metric, r.band, 1, '',
       pg_temp.bench_id(1, r.day - (SELECT t0 FROM pg_temp.bench_settings)::date, g.k),
       r.day + make_interval(mins => g.k % 1440, secs => g.k / 1440), r.median / 0.93, r.median,
       -0.07, -0.075, -0.065, 100, 100, true, true
FROM generate_series(7, :nodes - 1, 50) AS g(k)
CROSS JOIN LATERAL (SELECT * FROM series_daily d
                    WHERE d.node_id = pg_temp.bench_id(4, 0, g.k) AND d.test = 'nccl.all_reduce'
                      AND d.metric = 'busbw_gbs' AND d.band = 20 + (:nrows - 1) / 2 AND d.world_size = 1 AND d.pair = ''
                      AND d.day >= (SELECT t0 FROM pg_temp.bench_settings)::date + 100 + g.k % 200
                    ORDER BY d.day LIMIT 1) r;

\timing off
ANALYZE;
SELECT 'results' AS rows, count(*) FROM results
UNION ALL SELECT 'result_rows', count(*) FROM result_rows
UNION ALL SELECT 'verdicts', count(*) FROM verdicts
UNION ALL SELECT 'series_points', count(*) FROM series_points
UNION ALL SELECT 'series_daily', count(*) FROM series_daily
UNION ALL SELECT 'change_points (open)', count(*) FROM change_points WHERE worse AND latest;
SELECT pg_size_pretty(pg_database_size(current_database())) AS database_size;
