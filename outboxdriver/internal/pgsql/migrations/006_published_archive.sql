-- The archive of published rows (completion "archive"): the relay moves each batch here
-- in one statement, so the outbox table keeps only what waits and its index stays
-- small, with no UPDATE to pay. Append-only, in publication order: a BRIN index on
-- published_at is all cleanup needs. It has the outbox's columns as they are now.
CREATE TABLE IF NOT EXISTS {{.PublishedTable}} (LIKE {{.Table}} INCLUDING DEFAULTS);
CREATE INDEX IF NOT EXISTS {{.PublishedIndex}} ON {{.PublishedTable}} USING brin (published_at);
