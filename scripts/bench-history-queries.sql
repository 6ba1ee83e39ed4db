-- The reads timed by scripts/bench-history.sh, each as the server sends it (the file that
-- sends it in brackets), with EXPLAIN (ANALYZE, BUFFERS) once and then timed five times.
-- Variables: node (a node's id), band (the figure's size band).

\set ON_ERROR_STOP on
\pset pager off

\echo '== one series over a year: daily rollups (history/range.rs, rollups)'
PREPARE chart_year AS
SELECT (day::timestamp AT TIME ZONE 'UTC') AS t, n, sum / n AS mean, min, max, median,
       NULL::uuid AS result_id, NULL::uuid AS run_id
FROM series_daily
WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6
  AND day >= $7 AND day <= $8
ORDER BY day;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE chart_year(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', current_date - 365, current_date);

\echo '== one series over 30 days: its points, thinned to 1000, with their runs (history/range.rs, range)'
PREPARE chart_month AS
SELECT s.t, 1::int8 AS n, s.value AS mean, s.value AS min, s.value AS max, s.value AS median,
       s.result_id, v.run_id, s.total
FROM (
    SELECT p.t, p.value, p.result_id,
           row_number() OVER (ORDER BY p.t DESC, p.result_id DESC) AS newest, count(*) OVER () AS total
    FROM (SELECT t, value, result_id FROM series_points
          WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5
            AND pair = $6 AND ($7::timestamptz IS NULL OR t >= $7) AND t <= $8
          ORDER BY t DESC, result_id DESC LIMIT $10) p
) s
LEFT JOIN LATERAL (SELECT run_id FROM verdicts v
                   WHERE v.result_id = s.result_id AND v.received_at = s.t) v ON true
WHERE (s.newest - 1) % greatest(1, ceil(s.total::float8 / $9))::bigint = 0
ORDER BY s.t, s.result_id;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE chart_month(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', now() - interval '30 days', now(), 1000, 100000);

\echo '== the detector: a series newest 512 points (health/regress.rs, points)'
PREPARE detector AS
SELECT result_id, t AS received_at, value FROM series_points
WHERE node_id = $1 AND test = $2 AND metric = $3 AND band = $4 AND world_size = $5 AND pair = $6
ORDER BY t DESC, result_id DESC LIMIT $7;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE detector(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', 512);

\echo '== the same read as before series_points: verdicts.figures through jsonb_array_elements'
PREPARE detector_before AS
SELECT r.id AS result_id, r.job_id, r.received_at, (f->>'value')::float8 AS value
FROM verdicts v JOIN results r ON r.id = v.result_id, jsonb_array_elements(v.figures) f
WHERE v.node_id = $1 AND (v.test = $3 OR v.test = split_part($3, '.', 1))
  AND v.world_size = $2 AND f->>'test' = $3 AND f->>'metric' = $4
  AND (f->>'band')::int = $5 AND r.outcome = 'succeeded'
ORDER BY r.received_at DESC, r.id DESC LIMIT $6;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE detector_before(:'node', 1, 'nccl.all_reduce', 'busbw_gbs', :band, 512);

\echo '== the fleet open regressions list, GET /api/v1/regressions (health/regress/store.rs, list)'
PREPARE regressions AS
SELECT c.id, c.node_id, n.hostname, c.test, c.metric, c.size_band, c.world_size, c.t, c.before, c.after,
       c.relative_change, c.ci_low, c.ci_high, c.points_before, c.points_after, c.worse, c.latest,
       c.facts_changes, c.fleet, c.detected_at
FROM change_points c JOIN nodes n ON n.id = c.node_id
WHERE ($1 OR (c.worse AND c.latest))
  AND ($2::uuid IS NULL OR c.node_id = $2)
  AND ($3::timestamptz IS NULL OR c.t >= $3)
  AND ($4::text IS NULL OR c.test = $4 OR c.test LIKE $4 || '.%')
ORDER BY c.t DESC, c.id LIMIT $5;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE regressions(false, NULL, NULL, NULL, 1000);

\echo '== the fleet view: every node latest verdict per test (health/store.rs, fleet)'
PREPARE fleet AS SELECT node_id, test, verdict, judged_at FROM latest_verdicts;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE fleet;

\echo '== the same before latest_verdicts: DISTINCT ON over every verdict'
PREPARE fleet_before AS
SELECT DISTINCT ON (node_id, test) node_id, test, verdict, judged_at FROM verdicts ORDER BY node_id, test, judged_at DESC;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE fleet_before;

\echo '== on ingest: the node baseline (health/verdict.rs, baseline)'
PREPARE baseline AS
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x), count(*) FROM (
    SELECT (f->>'value')::float8 AS x
    FROM verdicts v, jsonb_array_elements(v.figures) f
    WHERE v.node_id = $1 AND v.result_id <> $2 AND v.world_size = $3 AND f->>'test' = $4 AND f->>'metric' = $5
      AND (f->>'band')::int = $6 AND v.received_at < $7 AND v.verdict IN ('pass', 'unknown')
    ORDER BY v.received_at DESC LIMIT $8) s;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE baseline(:'node', gen_random_uuid(), 1, 'nccl.all_reduce', 'busbw_gbs', :band, now(), 5);

\echo '== on ingest: the fleet median of the GPU model (health/verdict.rs, fleet_from_db; reused for 30 s)'
PREPARE fleet_median AS
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x), count(*) FROM (
    SELECT DISTINCT ON (v.node_id) (f->>'value')::float8 AS x
    FROM verdicts v, jsonb_array_elements(v.figures) f
    WHERE v.node_id <> $1 AND v.result_id <> $2 AND v.world_size = $3 AND f->>'test' = $4 AND f->>'metric' = $5
      AND (f->>'band')::int = $6 AND v.received_at <= $7 AND v.received_at > $7 - make_interval(days => $8)
      AND v.gpu_model IS NOT DISTINCT FROM $9
    ORDER BY v.node_id, v.received_at DESC) s;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
EXECUTE fleet_median(:'node', gen_random_uuid(), 1, 'nccl.all_reduce', 'busbw_gbs', :band, now(), 30, 'NVIDIA H100 80GB HBM3');

\echo '== every tick of every replica: results of the last day without a verdict (health/verdict.rs, judge_pending)'
PREPARE pending AS
SELECT r.id FROM results r LEFT JOIN verdicts v ON v.result_id = r.id AND v.received_at = r.received_at
WHERE v.result_id IS NULL AND r.received_at > now() - interval '1 day'
  AND r.received_at < now() - interval '5 seconds'
ORDER BY r.received_at LIMIT 100;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE pending;

\echo '== timings, five runs each (ms)'
\timing on
EXECUTE chart_year(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', current_date - 365, current_date) \g /dev/null
EXECUTE chart_year(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', current_date - 365, current_date) \g /dev/null
EXECUTE chart_year(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', current_date - 365, current_date) \g /dev/null
EXECUTE chart_year(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', current_date - 365, current_date) \g /dev/null
EXECUTE chart_year(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', current_date - 365, current_date) \g /dev/null
EXECUTE chart_month(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', now() - interval '30 days', now(), 1000, 100000) \g /dev/null
EXECUTE chart_month(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', now() - interval '30 days', now(), 1000, 100000) \g /dev/null
EXECUTE chart_month(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', now() - interval '30 days', now(), 1000, 100000) \g /dev/null
EXECUTE chart_month(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', now() - interval '30 days', now(), 1000, 100000) \g /dev/null
EXECUTE chart_month(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', now() - interval '30 days', now(), 1000, 100000) \g /dev/null
EXECUTE regressions(false, NULL, NULL, NULL, 1000) \g /dev/null
EXECUTE regressions(false, NULL, NULL, NULL, 1000) \g /dev/null
EXECUTE regressions(false, NULL, NULL, NULL, 1000) \g /dev/null
EXECUTE regressions(false, NULL, NULL, NULL, 1000) \g /dev/null
EXECUTE regressions(false, NULL, NULL, NULL, 1000) \g /dev/null
EXECUTE detector(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', 512) \g /dev/null
EXECUTE detector(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', 512) \g /dev/null
EXECUTE detector(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', 512) \g /dev/null
EXECUTE detector(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', 512) \g /dev/null
EXECUTE detector(:'node', 'nccl.all_reduce', 'busbw_gbs', :band, 1, '', 512) \g /dev/null
EXECUTE fleet \g /dev/null
EXECUTE fleet \g /dev/null
EXECUTE fleet \g /dev/null
EXECUTE fleet \g /dev/null
EXECUTE fleet \g /dev/null
\timing off
