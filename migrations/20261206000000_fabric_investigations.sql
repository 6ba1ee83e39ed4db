-- Fabric investigations (docs/fabric.md): the planner of heddle_types::fabric::plan chooses
-- each round's tests along the site's fabric, each test is one multi-node nccl run, and the
-- answer names the broken component. The investigation keeps its inputs (the suspects, the
-- nodes it may test, its limits, the evidence it started from) and every test with its
-- figure, so any replica rebuilds the planner from them on each step and goes on.
CREATE TABLE fabric_investigations (
    id              uuid PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL,
    label           text,
    state           text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed')),
    error           text,
    finished_at     timestamptz,
    suspects        text[] NOT NULL,
    -- The fabric's nodes it may test (enrolled, and idle unless include_busy).
    nodes           text[] NOT NULL,
    max_nodes       integer NOT NULL CHECK (max_nodes >= 0),
    max_rounds      integer NOT NULL CHECK (max_rounds BETWEEN 1 AND 50),
    suspects_only   boolean NOT NULL,
    -- Nodes running a job may be tested (by default a round leaves their tests out).
    include_busy    boolean NOT NULL DEFAULT false,
    timeout_s       integer NOT NULL CHECK (timeout_s > 0),
    seed            bigint NOT NULL,
    evidence        jsonb NOT NULL DEFAULT '[]',
    -- Suspects left out when it was created, and why.
    notes           text[] NOT NULL DEFAULT '{}',
    -- The round last started (0 before the first).
    round           integer NOT NULL DEFAULT 0,
    -- The planner's answer with its parts in the fabric's terms, once done.
    answer          jsonb,
    -- Every node whose traffic crosses a blamed component: their health says so.
    blamed_nodes    text[] NOT NULL DEFAULT '{}'
);
CREATE INDEX fabric_investigations_blamed_idx ON fabric_investigations USING gin (blamed_nodes);
CREATE INDEX fabric_investigations_created_idx ON fabric_investigations (created_at DESC, id);
CREATE INDEX fabric_investigations_running_idx ON fabric_investigations (created_at) WHERE state = 'running';

CREATE TABLE fabric_tests (
    investigation_id uuid NOT NULL REFERENCES fabric_investigations(id) ON DELETE CASCADE,
    test_id          text NOT NULL,
    round            integer NOT NULL,
    nodes            text[] NOT NULL,
    rail             integer,
    bytes            bigint NOT NULL,
    run_id           uuid REFERENCES runs(id) ON DELETE SET NULL,
    state            text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed', 'skipped')),
    busbw_gbs        double precision,
    error            text,
    seconds          double precision,
    PRIMARY KEY (investigation_id, test_id)
);
CREATE INDEX fabric_tests_run_idx ON fabric_tests (run_id);
