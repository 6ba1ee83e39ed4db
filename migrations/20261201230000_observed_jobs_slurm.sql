-- `GET /jobs?slurm_job=ID` (`heddle jobs ls --slurm-job ID`): one Slurm job's steps on every
-- node, without reading every node's kept jobs.
CREATE INDEX observed_jobs_slurm_idx ON observed_jobs (slurm_job_id, last_seen_at DESC, id)
    WHERE slurm_job_id IS NOT NULL;
