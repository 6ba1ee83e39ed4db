-- Every agent credential that stops being valid (revoked, or its row deleted with a
-- decommissioned node) is logged here by a trigger, so that replicas which remember
-- credentials in memory can forget it within HEDDLE_REVOCATION_DELAY_MS.
CREATE TABLE agent_revocations (
    agent_id uuid NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX agent_revocations_at_idx ON agent_revocations (at);

CREATE FUNCTION log_agent_revocation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO agent_revocations (agent_id) VALUES (OLD.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER agents_revoked AFTER UPDATE OF revoked_at, credential_sha256, node_id ON agents
    FOR EACH ROW
    WHEN (OLD.revoked_at IS NULL AND (NEW.revoked_at IS NOT NULL
          OR NEW.credential_sha256 IS DISTINCT FROM OLD.credential_sha256
          OR NEW.node_id IS DISTINCT FROM OLD.node_id))
    EXECUTE FUNCTION log_agent_revocation();

CREATE TRIGGER agents_deleted AFTER DELETE ON agents
    FOR EACH ROW EXECUTE FUNCTION log_agent_revocation();
