-- The CDC relay of many tables (one slot for all) confirms one position for all of
-- them: the furthest before which every table's events are done. Each table records
-- its own as well (every event of it committed at or before done_lsn is published or
-- dead-lettered), so that after a crash the stream, read again from the slot's
-- position, does not publish again what a faster table had already sent.
ALTER TABLE {{.CDCTable}} ADD COLUMN IF NOT EXISTS done_lsn pg_lsn;
