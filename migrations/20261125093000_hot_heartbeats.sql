-- Heartbeat flushes rewrite tens of thousands of agents and nodes rows a minute. Room left
-- on each page lets Postgres update them in place (a HOT update, no index touched); an
-- index on agents.last_heartbeat_at would forbid that, and only a metrics count used it.
DROP INDEX IF EXISTS agents_heartbeat_idx;
ALTER TABLE agents SET (fillfactor = 70);
ALTER TABLE nodes SET (fillfactor = 70);
