-- Every row belongs to one of {{.Partitions}} partitions, computed by the database from
-- (aggregatetype, aggregateid), so producers writing plain SQL need not know it and all
-- events of an aggregate share a partition. The hash is md5's first 32 bits, stable
-- across PostgreSQL versions and easy to compute anywhere (outboxdriver.PartitionOf).
-- The number of partitions is fixed here: changing it would move aggregates.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS partition smallint GENERATED ALWAYS AS
    (mod(('x' || substr(md5(aggregatetype || chr(31) || aggregateid), 1, 8))::bit(32)::bigint, {{.Partitions}})) STORED;

CREATE INDEX IF NOT EXISTS {{.PartitionIndex}} ON {{.Table}} (partition, seq) WHERE published_at IS NULL;
