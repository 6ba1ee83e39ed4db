-- Plugin outputs per node, and traits per source so a disabled plugin's traits can go.

ALTER TABLE plugin_versions ADD COLUMN contract text;
ALTER TABLE plugin_versions ADD COLUMN description text;

CREATE TABLE plugin_results (
    node_id       uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    plugin_id     uuid NOT NULL REFERENCES plugins(id) ON DELETE CASCADE,
    version_id    uuid NOT NULL REFERENCES plugin_versions(id) ON DELETE CASCADE,
    -- The facts the plugin saw: a changed hash means the result is stale.
    facts_sha256  text NOT NULL,
    -- traits, env, affinity, warnings as the plugin returned them; NULL when it failed.
    output        jsonb,
    error         text,
    usage         jsonb NOT NULL DEFAULT '{}'::jsonb,
    ran_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, plugin_id)
);

CREATE TABLE node_traits (
    node_id  uuid NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    source   text NOT NULL,
    traits   jsonb NOT NULL,
    PRIMARY KEY (node_id, source)
);
