-- Expectations set by operators: what a test's figure should reach on some hardware.
-- Built-in expectations live in code (server/src/health/expectations.rs), plugin ones in
-- plugin_results.output->'expectations'.

CREATE TABLE expectations (
    id              uuid PRIMARY KEY,
    test            text NOT NULL CHECK (length(test) BETWEEN 1 AND 128),
    metric          text NOT NULL CHECK (metric IN ('busbw_gbs', 'algbw_gbs', 'time_us')),
    min_size_bytes  bigint NOT NULL DEFAULT 0 CHECK (min_size_bytes >= 0),
    value           double precision NOT NULL CHECK (value > 0 AND value < 1e12),
    source          text NOT NULL CHECK (length(source) BETWEEN 1 AND 512),
    -- Scope; NULL matches everything.
    gpu_model       text CHECK (length(gpu_model) BETWEEN 1 AND 128),
    gpu_count       integer CHECK (gpu_count > 0),
    world_size      integer CHECK (world_size > 0),
    node_id         uuid REFERENCES nodes(id) ON DELETE CASCADE,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX expectations_test_idx ON expectations (test);
