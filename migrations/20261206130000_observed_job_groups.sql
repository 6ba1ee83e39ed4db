-- One home for what joins an observed job's rows across nodes, which three statements and
-- the progress judge had each spelled out.
--
-- A job's group is its job key, its owner (uid) and its `scope`: the node for a job known
-- only by its process (`pid:` keys, which another node may reuse), else the nil uuid. It
-- is `observed_progress`'s key, so the cross-node verdict of a row is a plain join.
ALTER TABLE observed_jobs
    ADD COLUMN scope uuid NOT NULL GENERATED ALWAYS AS (
        CASE WHEN job_key LIKE 'pid:%' THEN node_id ELSE '00000000-0000-0000-0000-000000000000'::uuid END
    ) STORED;

DROP INDEX observed_jobs_key_idx;
CREATE INDEX observed_jobs_group_idx ON observed_jobs (job_key, uid, scope);

-- One row per observed job as lists and `GET /workloads/{id}` show it: the node's host
-- name, counts over its processes and communicators, whether every process finished and
-- which node tuning profile they all applied, and the verdict across nodes of its group.
-- Filters on the job's own columns reach the table's indexes through the view.
CREATE VIEW observed_job_summaries AS
SELECT j.id, j.node_id, n.hostname, j.job_key, j.source, j.uid, j.slurm_job_id, j.k8s_namespace,
       j.k8s_pod, j.comm, j.first_seen_at, j.last_seen_at, j.verdict, j.reasons,
       count(DISTINCT c.pid::text || ':' || c.start_ticks::text) AS processes,
       count(DISTINCT c.comm_hash) AS communicators,
       coalesce(bool_and(c.is_final), false) AS finished,
       CASE WHEN bool_or(c.env_applied IS NULL) THEN NULL ELSE min(c.env_applied) END AS env_applied,
       p.verdict AS progress_verdict, p.reasons AS progress_reasons
FROM observed_jobs j
JOIN nodes n ON n.id = j.node_id
LEFT JOIN observed_comms c ON c.job_id = j.id
LEFT JOIN observed_progress p ON (p.job_key, p.uid, p.scope) = (j.job_key, j.uid, j.scope)
GROUP BY j.id, n.hostname, p.job_key, p.uid, p.scope;
