-- Retries, delayed events and dead letters (see the PostgreSQL migration for the why).
-- available_at is Unix milliseconds; 0 means "as soon as written".
ALTER TABLE {{.Table}} ADD COLUMN available_at INTEGER NOT NULL DEFAULT 0;

CREATE INDEX IF NOT EXISTS {{.FailingIndex}} ON {{.Table}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL AND attempts > 0;

CREATE TABLE IF NOT EXISTS {{.DeadTable}} (
    id                 TEXT    PRIMARY KEY,
    aggregatetype      TEXT    NOT NULL,
    aggregateid        TEXT    NOT NULL,
    type               TEXT    NOT NULL,
    payload            BLOB,
    headers            TEXT,
    tracingspancontext TEXT,
    seq                INTEGER NOT NULL,
    created_at         INTEGER NOT NULL,
    attempts           INTEGER NOT NULL,
    error              TEXT    NOT NULL,
    dead_at            INTEGER NOT NULL,
    holds_key          INTEGER NOT NULL
);

CREATE INDEX IF NOT EXISTS {{.DeadHoldIndex}} ON {{.DeadTable}} (aggregatetype, aggregateid) WHERE holds_key;
