-- Level shifts of nodes' figures over time (docs/health.md, "Regressions"). A series is one
-- node's figure of one test, metric, size band and world size (verdicts.figures); its
-- change points are computed again whenever a result adds to it, and replace the series'
-- earlier ones (a change keeps its detected_at while it stays at the same result).
CREATE TABLE change_points (
    id               uuid PRIMARY KEY,
    node_id          uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    test             text NOT NULL,
    metric           text NOT NULL,
    size_band        integer NOT NULL,
    world_size       integer NOT NULL,
    -- The first result after the change, and when it was received.
    result_id        uuid NOT NULL,
    t                timestamptz NOT NULL,
    before           double precision NOT NULL,
    after            double precision NOT NULL,
    relative_change  double precision NOT NULL,
    ci_low           double precision NOT NULL,
    ci_high          double precision NOT NULL,
    points_before    integer NOT NULL,
    points_after     integer NOT NULL,
    -- For the worse: lower bandwidth, higher latency.
    worse            boolean NOT NULL,
    -- The series' latest change: an open regression when also worse.
    latest           boolean NOT NULL,
    facts_changes    jsonb NOT NULL DEFAULT '[]',
    fleet            jsonb NOT NULL DEFAULT '{}',
    detected_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (node_id, test, metric, size_band, world_size, t)
);
CREATE INDEX change_points_open_idx ON change_points (t DESC) WHERE worse AND latest;
-- The fleet around a change: the same series key on other nodes at about the same time.
CREATE INDEX change_points_cohort_idx ON change_points (test, metric, size_band, world_size, t);

-- Operators tune the smallest change reported per test or kind with an expectation of
-- metric regression_min_change (a fraction).
ALTER TABLE expectations DROP CONSTRAINT expectations_metric_check;
ALTER TABLE expectations ADD CONSTRAINT expectations_metric_check
    CHECK (metric IN ('busbw_gbs', 'algbw_gbs', 'time_us', 'rdma_speedup', 'regression_min_change'));
