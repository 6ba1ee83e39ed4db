-- What a plugin recommended or said about a node's traits names the plugin by id, so the
-- reconciler replaces or removes one plugin's rows without parsing the display source
-- (`plugin:<name>@<version>`, `plugin:<name>`). NULL for an operator's own sources.
ALTER TABLE recommendations ADD COLUMN plugin_id uuid REFERENCES plugins(id) ON DELETE CASCADE;
ALTER TABLE node_traits ADD COLUMN plugin_id uuid REFERENCES plugins(id) ON DELETE CASCADE;

UPDATE recommendations r SET plugin_id = p.id FROM plugins p
    WHERE left(r.source, length(p.name) + 8) = 'plugin:' || p.name || '@';
UPDATE node_traits t SET plugin_id = p.id FROM plugins p WHERE t.source = 'plugin:' || p.name;
-- Rows of plugins that no longer exist: the reconciler writes what enabled plugins say again.
DELETE FROM recommendations WHERE source LIKE 'plugin:%' AND plugin_id IS NULL;
DELETE FROM node_traits WHERE source LIKE 'plugin:%' AND plugin_id IS NULL;

CREATE INDEX recommendations_plugin_idx ON recommendations (plugin_id) WHERE plugin_id IS NOT NULL;
CREATE INDEX node_traits_plugin_idx ON node_traits (plugin_id) WHERE plugin_id IS NOT NULL;
