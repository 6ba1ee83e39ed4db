-- The site's fabric (docs/fabric.md): one current document, as the importers of
-- heddle_types::fabric made it from its source, with who imported it from what and when.
-- Each import replaces it; the audit log keeps that it happened.
CREATE TABLE fabric (
    -- One row at most.
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    source text NOT NULL CHECK (source IN ('heddle', 'slurm-topology', 'ibnetdiscover')),
    document jsonb NOT NULL,
    imported_at timestamptz NOT NULL DEFAULT now(),
    imported_by text NOT NULL
);
