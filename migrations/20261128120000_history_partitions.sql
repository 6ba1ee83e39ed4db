-- History at scale (docs/health.md, "History"): what grows with every result is partitioned
-- by calendar month (UTC) of the result's arrival, so retention drops whole months instead
-- of deleting rows, and a series' figures get a table of their own with daily rollups.
--
-- results, result_rows, verdicts and series_points are range-partitioned on the result's
-- `received_at` (`t` in series_points), series_daily on its `day`; one partition per month,
-- named <table>_pYYYYMM, created ahead by the server (history::partitions). A partitioned
-- table's unique keys must hold its partition key, and detaching a partition that a
-- foreign key references makes Postgres look for referencing rows in the whole referencing
-- table, so no foreign key points at these tables:
--   * a result is unique per job and per upload key by the upload's transaction (the job's
--     row lock, an advisory lock on the key), no longer by unique indexes;
--   * result_rows, verdicts and series_points carry their result's arrival, so they land in
--     the same month and go with it; a trigger on results deletes them with their result
--     (what ON DELETE CASCADE did when a node is decommissioned);
--   * latest_verdicts keeps each node's latest verdict per test, so it outlives its month.
-- Foreign keys from these tables to jobs, agents, runs and nodes stay.
--
-- On a database with rows this rewrites every result row once, in this migration's
-- transaction.

-- 1. Helpers, called again by the server.

-- The 64 newest values of a day (by time, oldest first): the rollups' median is theirs.
CREATE FUNCTION series_recent(vals double precision[]) RETURNS double precision[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT vals[greatest(cardinality(vals) - 63, 1):] $$;

CREATE FUNCTION series_median(vals double precision[]) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(vals) x $$;

-- The partitioned history tables, in the order their months are dropped.
CREATE FUNCTION history_tables() RETURNS text[]
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['result_rows', 'series_points', 'verdicts', 'results', 'series_daily'] $$;

-- Creates the monthly partitions of every history table, from the month holding `first` to
-- the one holding `last`, that do not exist yet. Returns how many it created.
CREATE FUNCTION history_ensure_partitions(first date, last date) RETURNS integer
    LANGUAGE plpgsql AS $$
DECLARE
    parent text;
    month date;
    made integer := 0;
BEGIN
    FOREACH parent IN ARRAY history_tables() LOOP
        month := date_trunc('month', first)::date;
        WHILE month <= last LOOP
            IF to_regclass(format('%I', parent || '_p' || to_char(month, 'YYYYMM'))) IS NULL THEN
                -- Bounds in UTC whatever the session's time zone (a date column reads the day).
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                    parent || '_p' || to_char(month, 'YYYYMM'), parent,
                    to_char(month, 'YYYY-MM-DD') || ' 00:00:00+00',
                    to_char((month + interval '1 month')::date, 'YYYY-MM-DD') || ' 00:00:00+00');
                made := made + 1;
            END IF;
            month := (month + interval '1 month')::date;
        END LOOP;
    END LOOP;
    RETURN made;
END $$;

-- The monthly partitions of `parent` whose whole month lies before `before`, oldest first:
-- attached, pending a detach that was interrupted, or detached and not yet dropped (the
-- server detaches and drops them: history::retention).
CREATE FUNCTION history_expired_partitions(parent text, before date)
    RETURNS TABLE (name text, attached boolean, detach_pending boolean)
    LANGUAGE sql STABLE AS $$
    SELECT c.relname::text, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
    FROM pg_class c
    LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = to_regclass(format('%I', parent))
    WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
      AND c.relname ~ ('^' || parent || '_p[0-9]{6}$')
      AND (to_date(right(c.relname, 6), 'YYYYMM') + interval '1 month')::date <= before
    ORDER BY c.relname
$$;

-- 2. The old tables make way.
ALTER TABLE result_rows RENAME TO result_rows_unpartitioned;
ALTER TABLE verdicts RENAME TO verdicts_unpartitioned;
ALTER TABLE results RENAME TO results_unpartitioned;

CREATE TABLE results (
    id            uuid NOT NULL,
    job_id        uuid NOT NULL,
    upload_key    text NOT NULL,
    agent_id      uuid,
    outcome       text NOT NULL CHECK (outcome IN ('succeeded', 'failed', 'skipped', 'cancelled')),
    reason        text,
    exit_code     integer,
    stderr_tail   text,
    summary       jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (received_at);

-- One row per measured point: a size of a sweep, a cell of a tuning grid.
CREATE TABLE result_rows (
    result_id   uuid NOT NULL,
    seq         integer NOT NULL,
    size_bytes  bigint NOT NULL,
    count       bigint,
    dtype       text,
    op          text,
    root        integer,
    in_place    boolean,
    time_us     double precision,
    algbw_gbs   double precision,
    busbw_gbs   double precision,
    wrong       bigint,
    labels      jsonb NOT NULL DEFAULT '{}'::jsonb,
    extra       jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- The result's.
    received_at timestamptz NOT NULL
) PARTITION BY RANGE (received_at);

CREATE TABLE verdicts (
    result_id   uuid NOT NULL,
    run_id      uuid NOT NULL,
    node_id     uuid NOT NULL,
    test        text NOT NULL,
    verdict     text NOT NULL CHECK (verdict IN ('pass', 'warn', 'fail', 'unknown')),
    reasons     jsonb NOT NULL DEFAULT '[]'::jsonb,
    metric      text,
    value       double precision,
    judged_at   timestamptz NOT NULL DEFAULT now(),
    -- [{test, metric, size_bytes, band, value}]
    figures     jsonb NOT NULL DEFAULT '[]'::jsonb,
    world_size  integer NOT NULL DEFAULT 1,
    gpu_model   text,
    -- The result's.
    received_at timestamptz NOT NULL
) PARTITION BY RANGE (received_at);

-- One row per figure of a judged succeeded result: a point of its series (node, test,
-- metric, size band, world size, and the GPU pair of a per-pair figure or ''). What the
-- regression detector and charts read instead of verdicts.figures.
CREATE TABLE series_points (
    node_id     uuid NOT NULL,
    test        text NOT NULL,
    metric      text NOT NULL,
    band        integer NOT NULL,
    world_size  integer NOT NULL,
    pair        text NOT NULL DEFAULT '',
    -- The result's received_at.
    t           timestamptz NOT NULL,
    value       double precision NOT NULL,
    result_id   uuid NOT NULL
) PARTITION BY RANGE (t);

-- A series' points of one UTC day, kept longer than the points: count, sum (the mean is
-- sum / n), min, max, and the median of the day's 64 newest points (`recent`, oldest first).
CREATE TABLE series_daily (
    node_id     uuid NOT NULL,
    test        text NOT NULL,
    metric      text NOT NULL,
    band        integer NOT NULL,
    world_size  integer NOT NULL,
    pair        text NOT NULL DEFAULT '',
    day         date NOT NULL,
    n           bigint NOT NULL,
    sum         double precision NOT NULL,
    min         double precision NOT NULL,
    max         double precision NOT NULL,
    median      double precision NOT NULL,
    recent      double precision[] NOT NULL
) PARTITION BY RANGE (day);

-- Months of the rows there are, and three ahead.
SELECT history_ensure_partitions(
    least(current_date, (SELECT min(received_at) FROM results_unpartitioned)::date),
    (current_date + interval '3 months')::date);

-- 3. The rows move.
INSERT INTO results (id, job_id, upload_key, agent_id, outcome, reason, exit_code, stderr_tail, summary,
                     started_at, finished_at, received_at)
SELECT id, job_id, upload_key, agent_id, outcome, reason, exit_code, stderr_tail, summary,
       started_at, finished_at, received_at
FROM results_unpartitioned;

INSERT INTO result_rows (result_id, seq, size_bytes, count, dtype, op, root, in_place, time_us, algbw_gbs,
                         busbw_gbs, wrong, labels, extra, received_at)
SELECT rr.result_id, rr.seq, rr.size_bytes, rr.count, rr.dtype, rr.op, rr.root, rr.in_place, rr.time_us,
       rr.algbw_gbs, rr.busbw_gbs, rr.wrong, rr.labels, rr.extra, r.received_at
FROM result_rows_unpartitioned rr JOIN results_unpartitioned r ON r.id = rr.result_id;

INSERT INTO verdicts (result_id, run_id, node_id, test, verdict, reasons, metric, value, judged_at, figures,
                      world_size, gpu_model, received_at)
SELECT v.result_id, v.run_id, v.node_id, v.test, v.verdict, v.reasons, v.metric, v.value, v.judged_at, v.figures,
       v.world_size, v.gpu_model, r.received_at
FROM verdicts_unpartitioned v JOIN results_unpartitioned r ON r.id = v.result_id;

DROP TABLE result_rows_unpartitioned;
DROP TABLE verdicts_unpartitioned;
DROP TABLE results_unpartitioned;

-- Figures of succeeded results. A figure stored before figures had a band gets its size's
-- (floor of log2, as health::figures::size_band).
INSERT INTO series_points (node_id, test, metric, band, world_size, pair, t, value, result_id)
SELECT v.node_id, f->>'test', f->>'metric',
       coalesce((f->>'band')::int,
                CASE WHEN (f->>'size_bytes')::bigint > 0
                     THEN length(ltrim(((f->>'size_bytes')::bigint)::bit(64)::text, '0')) - 1
                     ELSE 0 END),
       v.world_size, coalesce(f->>'pair', ''), v.received_at, (f->>'value')::float8, v.result_id
FROM verdicts v JOIN results r ON r.id = v.result_id AND r.received_at = v.received_at,
     jsonb_array_elements(v.figures) f
WHERE r.outcome = 'succeeded' AND jsonb_typeof(f->'value') = 'number'
  AND f->>'test' IS NOT NULL AND f->>'metric' IS NOT NULL;

INSERT INTO series_daily (node_id, test, metric, band, world_size, pair, day, n, sum, min, max, median, recent)
SELECT node_id, test, metric, band, world_size, pair, day, n, sum, min, max, series_median(recent), recent
FROM (SELECT node_id, test, metric, band, world_size, pair, (t AT TIME ZONE 'UTC')::date AS day,
             count(*) AS n, sum(value) AS sum, min(value) AS min, max(value) AS max,
             series_recent(array_agg(value ORDER BY t, result_id)) AS recent
      FROM series_points GROUP BY 1, 2, 3, 4, 5, 6, 7) d;

-- 4. Keys, indexes, references.
ALTER TABLE results ADD PRIMARY KEY (id, received_at);
ALTER TABLE results ADD FOREIGN KEY (job_id) REFERENCES jobs(id) ON DELETE CASCADE;
ALTER TABLE results ADD FOREIGN KEY (agent_id) REFERENCES agents(id) ON DELETE SET NULL;
CREATE INDEX results_job_idx ON results (job_id);
CREATE INDEX results_upload_key_idx ON results (upload_key);
-- Results are found by arrival time when the judge catches up on ones it has not judged.
CREATE INDEX results_received_idx ON results (received_at);

ALTER TABLE result_rows ADD PRIMARY KEY (result_id, seq, received_at);

ALTER TABLE verdicts ADD PRIMARY KEY (result_id, received_at);
ALTER TABLE verdicts ADD FOREIGN KEY (run_id) REFERENCES runs(id) ON DELETE CASCADE;
ALTER TABLE verdicts ADD FOREIGN KEY (node_id) REFERENCES nodes(id) ON DELETE CASCADE;
CREATE INDEX verdicts_node_idx ON verdicts (node_id, test, judged_at DESC);
CREATE INDEX verdicts_run_idx ON verdicts (run_id);
CREATE INDEX verdicts_test_idx ON verdicts (test, judged_at DESC);
-- The investigation loop looks for recent warn/fail verdicts on every tick of every replica.
CREATE INDEX verdicts_bad_recent_idx ON verdicts (judged_at) WHERE verdict IN ('warn', 'fail');

-- A series' newest points (the detector), or those of a time range (charts).
CREATE INDEX series_points_series_idx ON series_points (node_id, test, metric, band, world_size, pair, t);
-- A result's points (judged again; deleted with it).
CREATE INDEX series_points_result_idx ON series_points (result_id);
ALTER TABLE series_points ADD FOREIGN KEY (node_id) REFERENCES nodes(id) ON DELETE CASCADE;

ALTER TABLE series_daily ADD PRIMARY KEY (node_id, test, metric, band, world_size, pair, day);
ALTER TABLE series_daily ADD FOREIGN KEY (node_id) REFERENCES nodes(id) ON DELETE CASCADE;

-- A result's rows, verdict and points go with it (node decommissioning deletes its jobs,
-- whose results go by their foreign key). An UPDATE that moves a result to another month
-- fires this too (Postgres moves it as a DELETE and an INSERT): the result is then still
-- there, and so is what hangs on it.
CREATE FUNCTION results_delete_dependents() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM results WHERE id = OLD.id) THEN
        RETURN NULL;
    END IF;
    DELETE FROM series_points WHERE result_id = OLD.id;
    DELETE FROM verdicts WHERE result_id = OLD.id;
    DELETE FROM result_rows WHERE result_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER results_delete_dependents AFTER DELETE ON results
    FOR EACH ROW EXECUTE FUNCTION results_delete_dependents();

-- 5. Each node's latest verdict per test (node and fleet health, /metrics): written with
-- every verdict, and kept when its month is dropped. `result_id` may name a result that is
-- gone.
CREATE TABLE latest_verdicts (
    node_id     uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    test        text NOT NULL,
    result_id   uuid NOT NULL,
    run_id      uuid NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    verdict     text NOT NULL CHECK (verdict IN ('pass', 'warn', 'fail', 'unknown')),
    reasons     jsonb NOT NULL DEFAULT '[]'::jsonb,
    metric      text,
    value       double precision,
    judged_at   timestamptz NOT NULL,
    figures     jsonb NOT NULL DEFAULT '[]'::jsonb,
    world_size  integer NOT NULL DEFAULT 1,
    gpu_model   text,
    received_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, test)
);
INSERT INTO latest_verdicts (node_id, test, result_id, run_id, verdict, reasons, metric, value, judged_at, figures,
                             world_size, gpu_model, received_at)
SELECT DISTINCT ON (node_id, test) node_id, test, result_id, run_id, verdict, reasons, metric, value, judged_at,
       figures, world_size, gpu_model, received_at
FROM verdicts ORDER BY node_id, test, judged_at DESC;
