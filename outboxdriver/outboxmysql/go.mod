module github.com/outboxd/outbox/outboxdriver/outboxmysql

go 1.25.0

toolchain go1.26.8

require github.com/outboxd/outbox v0.1.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// The project's own modules, from this checkout (a release replaces nothing:
// these lines are ignored where this module is a dependency).
replace github.com/outboxd/outbox => ../..
