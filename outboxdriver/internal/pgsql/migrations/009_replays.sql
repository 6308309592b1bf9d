-- Checkpoints of `outbox replay` (published events sent again): where each named
-- replay got to, so an interrupted one continues where it stopped, and with what
-- selection (a resume must ask for the same). A replay covers the history as it was
-- when it started (up to until_seq): events published meanwhile are live traffic.
CREATE TABLE IF NOT EXISTS {{.ReplaysTable}} (
    name        text        PRIMARY KEY,
    selection   text        NOT NULL,
    last_seq    bigint      NOT NULL DEFAULT 0,
    until_seq   bigint      NOT NULL DEFAULT 0,
    sent        bigint      NOT NULL DEFAULT 0,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
