-- The lease clock: leases are judged only on time in which a replica could write to the
-- database. Every reaper tick advances `ticked_at` (under this row's lock, so replicas take
-- turns); a tick that finds it further behind than the reaper's allowance knows that nobody
-- could judge leases meanwhile (Postgres down, or every replica down), and first gives the
-- leases from before that gap a fresh term (server/src/leases.rs, ARCHITECTURE.md).
CREATE TABLE lease_clock (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    ticked_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO lease_clock DEFAULT VALUES;
