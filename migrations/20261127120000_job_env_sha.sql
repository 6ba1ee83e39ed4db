-- Version of each node's job environment (heddle_types::nccl_conf::job_env_sha256), sent to
-- its agent in heartbeats so the agent rewrites its node env file only when it changed.
-- NULL: changed since last computed; the next heartbeat that reads the row computes it
-- (server/src/job_env.rs). Every write of recommendations, tuning profiles or a node's site
-- sets it back to NULL in the same transaction.
ALTER TABLE nodes ADD COLUMN job_env_sha256 text;
