-- Observed jobs: what NCCL's profiler plugin (Heddle's, or NCCL Inspector) saw of the jobs
-- that ran on a node, as its agent uploaded it. One row per node and job (the scheduler's
-- job, the pod, or the process), one row per process and communicator beneath it, each
-- holding the latest `seq` the agent sent (an upload with an older or equal seq changes
-- nothing, so uploads are idempotent). A node keeps its HEDDLE_OBSERVED_JOBS_KEEP most
-- recently seen jobs; older ones are dropped when a new one is stored.

CREATE TABLE observed_jobs (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id         uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    job_key         text NOT NULL,
    source          text NOT NULL CHECK (source IN ('profiler', 'inspector')),
    uid             bigint NOT NULL,
    slurm_job_id    text,
    k8s_namespace   text,
    k8s_pod         text,
    comm            text,
    first_seen_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    verdict         text NOT NULL DEFAULT 'unknown' CHECK (verdict IN ('pass', 'warn', 'fail', 'unknown')),
    reasons         jsonb NOT NULL DEFAULT '[]',
    judged_at       timestamptz,
    -- Another user naming the same scheduler job is another job: the uid is the agent's
    -- check of the file's owner, the job key only what the file says.
    UNIQUE (node_id, job_key, uid)
);
CREATE INDEX observed_jobs_node_seen_idx ON observed_jobs (node_id, last_seen_at DESC, id);
CREATE INDEX observed_jobs_seen_idx ON observed_jobs (last_seen_at DESC, id);

CREATE TABLE observed_comms (
    job_id          uuid NOT NULL REFERENCES observed_jobs(id) ON DELETE CASCADE,
    pid             bigint NOT NULL,
    start_ticks     bigint NOT NULL,
    comm_hash       text NOT NULL,
    seq             bigint NOT NULL,
    is_final        boolean NOT NULL,
    written_at      timestamptz NOT NULL,
    env_applied     text,
    name            text,
    nranks          integer NOT NULL,
    nnodes          integer NOT NULL,
    rank            integer NOT NULL,
    ops             jsonb NOT NULL,
    net             jsonb NOT NULL,
    finalized       boolean NOT NULL,
    PRIMARY KEY (job_id, pid, start_ticks, comm_hash)
);
