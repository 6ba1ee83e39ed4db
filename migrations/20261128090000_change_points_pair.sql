-- A p2p result's figures include one per GPU pair (docs/health.md, "Regressions"), each its
-- own series: the pair is part of the series key. '' for every figure without one (the
-- worst pair's, and every other kind's), as coalesce(f->>'pair', '') reads verdicts.figures.
ALTER TABLE change_points ADD COLUMN pair text NOT NULL DEFAULT '';

ALTER TABLE change_points DROP CONSTRAINT change_points_node_id_test_metric_size_band_world_size_t_key;
ALTER TABLE change_points ADD CONSTRAINT change_points_series_t_key
    UNIQUE (node_id, test, metric, size_band, world_size, pair, t);

-- The fleet around a change: the same series key, pair included, on other nodes.
DROP INDEX change_points_cohort_idx;
CREATE INDEX change_points_cohort_idx ON change_points (test, metric, size_band, world_size, pair, t);
