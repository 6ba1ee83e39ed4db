-- Node identity and job claims.

-- An enrollment token may be bound to one node: only that host name may enroll with it,
-- and it may replace the node's live agent without an admin's approval.
ALTER TABLE enrollment_tokens ADD COLUMN node text;

-- At most one live agent per node; a second one for the same host name waits for approval.
CREATE UNIQUE INDEX agents_one_live_per_node ON agents (node_id) WHERE revoked_at IS NULL;

-- An enrollment under the host name of a node whose agent is still live. The newcomer holds
-- a ticket (stored as SHA-256) and asks again until an admin approves or rejects it.
CREATE TABLE pending_enrollments (
    id                   uuid PRIMARY KEY,
    node_id              uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    hostname             text NOT NULL,
    ticket_sha256        text NOT NULL UNIQUE,
    enrollment_token_id  uuid REFERENCES enrollment_tokens(id) ON DELETE SET NULL,
    agent_version        text,
    state                text NOT NULL DEFAULT 'pending'
                           CHECK (state IN ('pending', 'approved', 'rejected', 'completed')),
    requested_at         timestamptz NOT NULL DEFAULT now(),
    decided_at           timestamptz,
    decided_by           text,
    agent_id             uuid REFERENCES agents(id) ON DELETE SET NULL
);
CREATE INDEX pending_enrollments_state_idx ON pending_enrollments (state, requested_at);

-- The job's latest claim: a fresh id per claim and the agent that made it. Unlike the lease
-- columns they outlive the lease, so a late result can be matched to the claim it ran under.
ALTER TABLE jobs ADD COLUMN claim_id uuid;
ALTER TABLE jobs ADD COLUMN claim_agent_id uuid REFERENCES agents(id) ON DELETE SET NULL;
-- Leases held while this migration runs keep their holder, so their results still land.
UPDATE jobs SET claim_agent_id = lease_agent_id, claim_id = gen_random_uuid()
WHERE lease_agent_id IS NOT NULL;
