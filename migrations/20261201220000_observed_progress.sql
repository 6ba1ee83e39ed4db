-- Progress of observed jobs across nodes. Each process's row of a communicator also keeps
-- the rank's progress as the profiler plugin wrote it (how far it got, what it is in and
-- since when, when it entered its recent collectives), the offset of its node's clock to
-- the server's that the agent measured (added to the progress times to compare them
-- across nodes), and when the server last stored it (a rank whose reports stop coming is
-- named by this, on the server's clock).
ALTER TABLE observed_comms
    ADD COLUMN progress        jsonb,
    ADD COLUMN clock_offset_ns bigint NOT NULL DEFAULT 0,
    ADD COLUMN received_at     timestamptz NOT NULL DEFAULT now();

-- The ranks of one job on every node are joined by job key and owner (uid): another user
-- naming the same scheduler job is another job. A job known only by its process (`pid:`
-- keys) is joined within its node only (`scope` is then the node, else the nil uuid).
CREATE INDEX observed_jobs_key_idx ON observed_jobs (job_key, uid);

CREATE TABLE observed_progress (
    job_key    text NOT NULL,
    uid        bigint NOT NULL,
    scope      uuid NOT NULL,
    verdict    text NOT NULL CHECK (verdict IN ('pass', 'warn', 'fail', 'unknown')),
    reasons    jsonb NOT NULL DEFAULT '[]',
    -- The per-rank table `GET /jobs/{id}` shows.
    ranks      jsonb NOT NULL DEFAULT '[]',
    judged_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_key, uid, scope)
);
