-- The dead letters and the archive take the outbox's own payload type. A table that
-- began as a Debezium outbox may have payload text (or varchar, json, bytea) rather
-- than the type the migrations were rendered with; a dead letter's move must then not
-- fail on a type mismatch (it would leave every event of its batch unmarked). A
-- column the relay cannot use is refused here, in one line, before any relay meets it.
DO $$
DECLARE
    id_type  text := (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                      WHERE attrelid = '{{.Table}}'::regclass AND attname = 'id' AND NOT attisdropped);
    want     text := (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                      WHERE attrelid = '{{.Table}}'::regclass AND attname = 'payload' AND NOT attisdropped);
    base     text := (SELECT t.typname FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid
                      WHERE a.attrelid = '{{.Table}}'::regclass AND a.attname = 'payload' AND NOT a.attisdropped);
    have     text;
    other    regclass;
BEGIN
    IF id_type IS DISTINCT FROM 'uuid' THEN
        RAISE EXCEPTION 'outbox table {{.Table}}: column id is %, the relay needs uuid (ALTER TABLE {{.Table}} ALTER COLUMN id TYPE uuid USING id::uuid)', coalesce(id_type, 'missing');
    END IF;
    IF base IS NULL OR base NOT IN ('jsonb', 'json', 'text', 'varchar', 'bpchar', 'bytea') THEN
        RAISE EXCEPTION 'outbox table {{.Table}}: column payload is %, the relay needs jsonb, json, text, varchar or bytea', coalesce(want, 'missing');
    END IF;
    FOREACH other IN ARRAY ARRAY['{{.DeadTable}}'::regclass, '{{.PublishedTable}}'::regclass] LOOP
        have := (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                 WHERE attrelid = other AND attname = 'payload' AND NOT attisdropped);
        CONTINUE WHEN have = want;
        EXECUTE format('ALTER TABLE %s ALTER COLUMN payload TYPE %s USING %s', other, want,
            CASE WHEN base = 'bytea' THEN 'convert_to(payload::text, ''UTF8'')'
                 WHEN have = 'bytea' THEN format('convert_from(payload, ''UTF8'')::%s', want)
                 ELSE format('payload::text::%s', want) END);
    END LOOP;
END
$$;
