-- Nodes whose plugin results may be stale, found by the reconciler through a partial index
-- instead of comparing every node with every enabled plugin on each pass (at 50,000 nodes
-- that comparison kept a third of a core of Postgres busy while facts arrived).
--
-- The flag is a hint, never the rule: the reconciler checks each node it claims against
-- the exact staleness rule (server/src/plugins/reconciler.rs), clears the flag only for a
-- node whose facts are still the ones it saw, and once a minute flags every node the rule
-- finds stale but the flag missed.
ALTER TABLE nodes ADD COLUMN plugins_due boolean NOT NULL DEFAULT true;
ALTER TABLE nodes ALTER COLUMN plugins_due SET DEFAULT false;
CREATE INDEX nodes_plugins_due_idx ON nodes (id) WHERE plugins_due;

-- New facts (a new hash, or facts where there were none) make a node due; so does a node
-- inserted with facts.
CREATE FUNCTION nodes_plugins_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.plugins_due := NEW.plugins_due OR NEW.facts IS NOT NULL OR NEW.facts_sha256 IS NOT NULL;
    ELSIF OLD.facts_sha256 IS DISTINCT FROM NEW.facts_sha256
          OR (OLD.facts IS NULL) <> (NEW.facts IS NULL) THEN
        NEW.plugins_due := true;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER nodes_plugins_due BEFORE INSERT OR UPDATE OF facts, facts_sha256 ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_plugins_due();

-- A plugin added, removed, enabled, disabled or given another active version makes every
-- node due.
CREATE FUNCTION plugins_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE nodes SET plugins_due = true WHERE NOT plugins_due;
    RETURN NULL;
END $$;
CREATE TRIGGER plugins_changed AFTER INSERT OR DELETE OR UPDATE OF enabled, active_version_id ON plugins
    FOR EACH STATEMENT EXECUTE FUNCTION plugins_changed();
