-- The head rule (see the PostgreSQL migration): each claimed row looks up the nearest
-- earlier unpublished row of its aggregate here (published_at IS NULL is an equality
-- on the index, seq the range).
CREATE INDEX {{.HeadIndex}} ON {{.Table}} (aggregatetype(191), aggregateid(191), published_at, seq);
