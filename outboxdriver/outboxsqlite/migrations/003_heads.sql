-- The head rule (see the PostgreSQL migration): each claimed row looks up the nearest
-- earlier unpublished row of its aggregate here.
CREATE INDEX IF NOT EXISTS {{.HeadIndex}} ON {{.Table}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL;
