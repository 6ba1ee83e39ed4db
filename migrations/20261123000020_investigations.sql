-- Investigations: a two-node test on every pair of a set of nodes, to find the bad node or
-- link of a slow multi-node run. Advanced by every replica's investigation loop.

CREATE TABLE investigations (
    id              uuid PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('nccl', 'rdma')),
    params          jsonb NOT NULL DEFAULT '{}'::jsonb,
    env             jsonb NOT NULL DEFAULT '{}'::jsonb,
    timeout_s       integer,
    -- Pairs at a time; 0 queues all of them at once, in round order.
    batch_size      integer NOT NULL CHECK (batch_size >= 0),
    threshold       double precision NOT NULL CHECK (threshold > 0 AND threshold < 1),
    -- In the order given; pairs refer to nodes by their index here.
    node_ids        uuid[] NOT NULL,
    label           text,
    state           text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed')),
    error           text,
    -- The run whose warn/fail verdict started it (automatic investigations): one per run.
    trigger_run_id  uuid UNIQUE REFERENCES runs(id) ON DELETE SET NULL,
    created_by      text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX investigations_created_idx ON investigations (created_at DESC);
CREATE INDEX investigations_running_idx ON investigations (created_at) WHERE state = 'running';

CREATE TABLE investigation_pairs (
    investigation_id  uuid NOT NULL REFERENCES investigations(id) ON DELETE CASCADE,
    -- Indexes into investigations.node_ids; a is rank 0 of the pair's run.
    a                 integer NOT NULL,
    b                 integer NOT NULL,
    batch             integer NOT NULL CHECK (batch >= 0),
    state             text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'done', 'failed')),
    run_id            uuid UNIQUE REFERENCES runs(id) ON DELETE SET NULL,
    -- The headline figure (GB/s) and the message size it was measured at.
    value             double precision,
    size_bytes        bigint,
    error             text,
    PRIMARY KEY (investigation_id, a, b),
    CHECK (a >= 0 AND a < b)
);
CREATE INDEX investigation_pairs_batch_idx ON investigation_pairs (investigation_id, batch);
