-- Retries, delayed events and dead letters.

-- When a row may be (re)tried: now for a new event, later for a delayed one (the
-- writer's NotBefore) or one backing off after a failure.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS available_at timestamptz NOT NULL DEFAULT now();

-- Rows that failed and wait for a retry; the later rows of their aggregate wait behind
-- them. Empty while all is well, so the claim's check against it is nearly free.
CREATE INDEX IF NOT EXISTS {{.FailingIndex}} ON {{.Table}} (aggregatetype, aggregateid, seq)
    WHERE published_at IS NULL AND attempts > 0;

-- Events refused permanently or past the attempt limit, moved here with their error.
CREATE TABLE IF NOT EXISTS {{.DeadTable}} (
    id                 uuid        PRIMARY KEY,
    aggregatetype      text        NOT NULL,
    aggregateid        text        NOT NULL,
    type               text        NOT NULL,
    payload            {{.PayloadType}},
    headers            jsonb,
    tracingspancontext text,
    seq                bigint      NOT NULL, -- kept, so a replay goes back in order
    created_at         timestamptz NOT NULL,
    attempts           integer     NOT NULL,
    error              text        NOT NULL,
    dead_at            timestamptz NOT NULL DEFAULT now(),
    holds_key          boolean     NOT NULL  -- later events of the aggregate wait for a replay or purge
);

CREATE INDEX IF NOT EXISTS {{.DeadHoldIndex}} ON {{.DeadTable}} (aggregatetype, aggregateid) WHERE holds_key;
