-- Published rows by the time they were published, for cleanup (see the PostgreSQL
-- migration for the why): without it, each cleanup read the whole table while no row
-- was past the retention.
CREATE INDEX IF NOT EXISTS {{.CleanupIndex}} ON {{.Table}} (published_at) WHERE published_at IS NOT NULL;
