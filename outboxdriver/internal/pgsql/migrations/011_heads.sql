-- The head rule: a claim takes a row only when no earlier unpublished event of its
-- aggregate is left out, whoever holds it (docs/architecture.md#per-aggregate-order).
-- Each claimed row looks up the nearest earlier unpublished row of its aggregate
-- here: one index probe, however many published rows the aggregate keeps.
CREATE INDEX IF NOT EXISTS {{.HeadIndex}} ON {{.Table}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL;
