-- The outbox table. The first five columns are Debezium's and are all a producer in any
-- language must insert; every other column has a default.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id                 uuid        {{if .Partitioned}}NOT NULL{{else}}PRIMARY KEY{{end}} DEFAULT gen_random_uuid(),
    aggregatetype      text        NOT NULL,
    aggregateid        text        NOT NULL,
    type               text        NOT NULL,
    payload            {{.PayloadType}},
    headers            jsonb,
    tracingspancontext text,
    -- write order: the relay claims in this order (never as a high-water mark)
    seq                bigint      GENERATED ALWAYS AS IDENTITY,
    created_at         timestamptz NOT NULL DEFAULT now(),
    published_at       timestamptz,
    attempts           integer     NOT NULL DEFAULT 0,
    last_error         text{{if .Partitioned}},
    -- Daily partitions on created_at, dropped whole once published (see Cleanup). A
    -- partitioned table's keys must include the partition column, so id alone is not
    -- enforced unique across partitions.
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
-- Rows for a day with no partition of its own land here rather than fail.
CREATE TABLE IF NOT EXISTS {{.DefaultPartition}} PARTITION OF {{.Table}} DEFAULT{{else}}
){{end}};

-- A table that already exists (a Debezium outbox with its five columns) gets the rest;
-- rows it holds are numbered in physical order.
ALTER TABLE {{.Table}}
    ADD COLUMN IF NOT EXISTS headers            jsonb,
    ADD COLUMN IF NOT EXISTS tracingspancontext text,
    ADD COLUMN IF NOT EXISTS seq                bigint      GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN IF NOT EXISTS created_at         timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS published_at       timestamptz,
    ADD COLUMN IF NOT EXISTS attempts           integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_error         text;

-- Only unpublished rows are indexed, so the claim query stays small however many
-- published rows are kept.
CREATE INDEX IF NOT EXISTS {{.UnpublishedIndex}} ON {{.Table}} (seq) WHERE published_at IS NULL;
