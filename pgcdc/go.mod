module github.com/outboxd/outbox/pgcdc

go 1.26.0

toolchain go1.26.8

require (
	github.com/outboxd/outbox v0.1.0
	github.com/outboxd/outbox/broker/nats v0.1.0
	github.com/outboxd/outbox/relay v0.1.0
)

require (
	github.com/google/uuid v1.6.0
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	github.com/outboxd/outbox/broker/webhook v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// The project's own modules, from this checkout (a release replaces nothing:
// these lines are ignored where this module is a dependency).
replace (
	github.com/outboxd/outbox => ..
	github.com/outboxd/outbox/broker/brokertest => ../broker/brokertest
	github.com/outboxd/outbox/broker/kafka => ../broker/kafka
	github.com/outboxd/outbox/broker/nats => ../broker/nats
	github.com/outboxd/outbox/broker/webhook => ../broker/webhook
	github.com/outboxd/outbox/internal/natsembed => ../internal/natsembed
	github.com/outboxd/outbox/outboxdriver/outboxmysql => ../outboxdriver/outboxmysql
	github.com/outboxd/outbox/outboxdriver/outboxsqlite => ../outboxdriver/outboxsqlite
	github.com/outboxd/outbox/relay => ../relay
)
