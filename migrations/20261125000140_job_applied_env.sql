-- The environment each job's test runs with: the node's effective environment (plugin
-- recommendations, site and node tuning profiles) under the run's own env, as
-- [{name, value, source}] sorted by name. NULL for jobs stored before it was recorded:
-- those ran with their run's env.
ALTER TABLE jobs ADD COLUMN applied_env jsonb;
