-- Several active relays (relay.Config.Group): a registry of live relays and one lease
-- row per partition. A lease's epoch grows each time the partition changes hands; a
-- relay's write-back only applies while it still holds the epoch it claimed under.
CREATE TABLE IF NOT EXISTS {{.RelaysTable}} (
    id           text        PRIMARY KEY,
    info         text        NOT NULL DEFAULT '',
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {{.LeasesTable}} (
    partition   smallint    PRIMARY KEY,
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);

INSERT INTO {{.LeasesTable}} (partition) SELECT generate_series(0, {{.Partitions}} - 1) ON CONFLICT DO NOTHING;
