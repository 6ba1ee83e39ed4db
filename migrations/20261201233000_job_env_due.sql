-- The nodes whose job environment version is unknown (set NULL by a write to what it is
-- computed from), found by the versions worker every few seconds without reading every node.
CREATE INDEX nodes_job_env_due ON nodes (id) WHERE job_env_sha256 IS NULL;
