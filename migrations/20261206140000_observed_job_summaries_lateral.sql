-- The workload summaries count each job's processes and communicators in a LATERAL
-- subquery rather than grouping the join of every job with its rows, so that filters,
-- order and limit on the job's own columns reach the table's indexes through the view and
-- a page of the list counts only the jobs on it (scripts/bench-observed.sh). Same columns,
-- same values.
CREATE OR REPLACE VIEW observed_job_summaries AS
SELECT j.id, j.node_id, n.hostname, j.job_key, j.source, j.uid, j.slurm_job_id, j.k8s_namespace,
       j.k8s_pod, j.comm, j.first_seen_at, j.last_seen_at, j.verdict, j.reasons,
       c.processes, c.communicators, c.finished, c.env_applied,
       p.verdict AS progress_verdict, p.reasons AS progress_reasons
FROM observed_jobs j
JOIN nodes n ON n.id = j.node_id
LEFT JOIN observed_progress p ON (p.job_key, p.uid, p.scope) = (j.job_key, j.uid, j.scope)
CROSS JOIN LATERAL (
    SELECT count(DISTINCT c.pid::text || ':' || c.start_ticks::text) AS processes,
           count(DISTINCT c.comm_hash) AS communicators,
           coalesce(bool_and(c.is_final), false) AS finished,
           CASE WHEN bool_or(c.env_applied IS NULL) THEN NULL ELSE min(c.env_applied) END AS env_applied
    FROM observed_comms c WHERE c.job_id = j.id
) c;
