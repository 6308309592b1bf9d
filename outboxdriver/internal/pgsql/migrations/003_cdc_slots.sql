-- The CDC relay's bookkeeping, one row per replication slot it manages. A slot with
-- backfilled_at NULL was created but the rows committed before it have not all been
-- published yet; a row whose slot is gone means the slot was lost (see docs/cdc.md).
CREATE TABLE IF NOT EXISTS {{.CDCTable}} (
    slot           text        PRIMARY KEY,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- rows up to this seq were written before the slot: the backfill publishes them
    backfill_until bigint,
    backfilled_at  timestamptz
);
