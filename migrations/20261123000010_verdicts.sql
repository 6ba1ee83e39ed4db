-- Fleet health: every stored result gets a verdict (pass / warn / fail) with its reasons.

CREATE TABLE verdicts (
    result_id   uuid PRIMARY KEY REFERENCES results(id) ON DELETE CASCADE,
    run_id      uuid NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    node_id     uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    -- What was measured, `<kind>.<test>`: `nccl.all_reduce`, `rdma.ib_write_bw`, `ucx.tag_bw`, `p2p.d2d`.
    test        text NOT NULL,
    verdict     text NOT NULL CHECK (verdict IN ('pass', 'warn', 'fail', 'unknown')),
    -- [{severity, message, metric, observed, expected, basis}], worst first.
    reasons     jsonb NOT NULL DEFAULT '[]'::jsonb,
    -- The headline figure the verdict is about (e.g. busbw at the largest size) and its metric.
    metric      text,
    value       double precision,
    judged_at   timestamptz NOT NULL DEFAULT now(),
    -- Every figure judged, [{test, metric, size_bytes, value}]: node baselines and fleet
    -- medians are taken over these.
    figures     jsonb NOT NULL DEFAULT '[]'::jsonb,
    -- What makes figures comparable besides the test: nodes in the run, and the node's GPU
    -- model when it was judged.
    world_size  integer NOT NULL DEFAULT 1,
    gpu_model   text
);
CREATE INDEX verdicts_node_idx ON verdicts (node_id, test, judged_at DESC);
CREATE INDEX verdicts_run_idx ON verdicts (run_id);
CREATE INDEX verdicts_test_idx ON verdicts (test, judged_at DESC);
