-- Published rows by the time they were published, for cleanup: without it, every
-- cleanup (once a minute) read the whole table while no row was past the retention,
-- which is always, once cleanup has caught up. A table of many millions of rows can
-- take it without blocking writers: create it CONCURRENTLY by hand first, with the
-- same name (`outbox migrate --print` prints it); this step then finds it there.
CREATE INDEX IF NOT EXISTS {{.CleanupIndex}} ON {{.Table}} (published_at) WHERE published_at IS NOT NULL;
