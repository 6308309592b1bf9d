-- The outbox table, SQLite's closest equivalent of the PostgreSQL one. seq is the
-- rowid (write order); id is unique. Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    id                 TEXT    NOT NULL UNIQUE,
    aggregatetype      TEXT    NOT NULL,
    aggregateid        TEXT    NOT NULL,
    type               TEXT    NOT NULL,
    payload            BLOB,
    headers            TEXT,
    tracingspancontext TEXT,
    created_at         INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    published_at       INTEGER,
    attempts           INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT
);

CREATE INDEX IF NOT EXISTS {{.UnpublishedIndex}} ON {{.Table}} (seq) WHERE published_at IS NULL;

-- One relay at a time: a lease row, renewed by the active relay.
CREATE TABLE IF NOT EXISTS {{.LeaderTable}} (
    name       TEXT    PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
);
