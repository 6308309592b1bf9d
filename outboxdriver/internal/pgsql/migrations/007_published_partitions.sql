-- On a table partitioned by day, the archive of published rows is partitioned by day
-- of publication too, so cleanup drops whole days of it instead of deleting rows.
-- An archive made before this migration becomes the default partition, with the rows
-- it holds; the relay's cleanup creates the coming days' partitions and drops past ones.
{{if .Partitioned}}DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = '{{.PublishedTable}}'::regclass) THEN
        ALTER TABLE {{.PublishedTable}} RENAME TO {{.PublishedDefaultName}};
        CREATE TABLE {{.PublishedTable}} (LIKE {{.Table}} INCLUDING DEFAULTS) PARTITION BY RANGE (published_at);
        ALTER TABLE {{.PublishedTable}} ATTACH PARTITION {{.PublishedDefault}} DEFAULT;
        CREATE INDEX IF NOT EXISTS {{.PublishedDayIndex}} ON {{.PublishedTable}} USING brin (published_at);
    END IF;
END
$$;{{else}}SELECT 1;{{end}}
