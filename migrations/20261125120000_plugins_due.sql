-- Nodes whose plugin results may be stale, found by the reconciler through two indexes
-- instead of comparing every node with every enabled plugin on each pass (at 50,000 nodes
-- that comparison kept a third of a core of Postgres busy while facts arrived).
--
-- A node is due when its facts changed since it was last evaluated (`plugins_due`, set by a
-- trigger) or when the plugin set changed since (`plugins_seen`, the mark of the plugin set
-- it was last evaluated against, behind `plugin_set.mark`). The view `plugins_due_nodes` is
-- that rule's home
-- for counting; `is_plugins_due` is the rule itself.
--
-- Due is a hint, never the rule: the reconciler checks each node it claims against the
-- exact staleness rule (server/src/plugins/reconciler.rs), settles a node only while its
-- facts are still the ones it saw and with the mark it read before reading the plugins, and
-- once a minute flags every node the rule finds stale but nothing marked due.
ALTER TABLE nodes ADD COLUMN plugins_due boolean NOT NULL DEFAULT false;
CREATE INDEX nodes_plugins_due_idx ON nodes (id) WHERE plugins_due;

-- The plugin set's mark: one row, moved on in the same transaction as every change to the
-- set. A transaction's row, not a sequence: a sequence moves on before the change commits,
-- so a batch could read the new mark with the old plugins. Nodes start behind it, so every
-- node is evaluated once after this migration.
CREATE TABLE plugin_set (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    mark bigint NOT NULL
);
INSERT INTO plugin_set (mark) VALUES (1);
ALTER TABLE nodes ADD COLUMN plugins_seen bigint NOT NULL DEFAULT 0;
CREATE INDEX nodes_plugins_seen_idx ON nodes (plugins_seen);

-- The rule, for a node and the plugin set's mark. The reconciler passes the mark as a
-- parameter: Postgres then plans with its value and reads both indexes, where a mark read
-- by a subquery gets a guessed third of the table and a scan of every node.
CREATE FUNCTION is_plugins_due(due boolean, seen bigint, mark bigint) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT due OR seen < mark $$;

CREATE VIEW plugins_due_nodes AS
    SELECT n.id FROM nodes n
    WHERE is_plugins_due(n.plugins_due, n.plugins_seen, (SELECT mark FROM plugin_set));

-- New facts (a new hash, or facts where there were none) make a node due; so does a node
-- inserted with facts. A node inserted without facts has nothing for any plugin to look
-- at, so it starts level with the plugin set rather than costing the reconciler a pass.
CREATE FUNCTION nodes_plugins_due() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.plugins_due := NEW.plugins_due OR NEW.facts IS NOT NULL OR NEW.facts_sha256 IS NOT NULL;
        NEW.plugins_seen := (SELECT mark FROM plugin_set);
    ELSIF OLD.facts_sha256 IS DISTINCT FROM NEW.facts_sha256
          OR (OLD.facts IS NULL) <> (NEW.facts IS NULL) THEN
        NEW.plugins_due := true;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER nodes_plugins_due BEFORE INSERT OR UPDATE OF facts, facts_sha256 ON nodes
    FOR EACH ROW EXECUTE FUNCTION nodes_plugins_due();

-- A plugin added, removed, enabled, disabled or given another active version moves the
-- plugin set's mark on, which makes every node due without writing to any of them (a
-- write to every node would hold 50,000 row locks against heartbeats until the change
-- commits).
CREATE FUNCTION plugins_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE plugin_set SET mark = mark + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER plugins_changed AFTER INSERT OR DELETE OR UPDATE OF enabled, active_version_id ON plugins
    FOR EACH STATEMENT EXECUTE FUNCTION plugins_changed();
