module github.com/outboxd/outbox/inbox/kafkainbox

go 1.26.0

toolchain go1.26.8

require (
	github.com/outboxd/outbox v0.1.0
	github.com/outboxd/outbox/broker/kafka v0.1.0
	github.com/outboxd/outbox/inbox v0.1.0
)

require (
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	go.uber.org/goleak v1.3.0
)

require (
	github.com/dustin/go-humanize v1.1.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-isatty v0.0.24 // indirect
	github.com/ncruces/go-strftime v1.1.0 // indirect
	github.com/outboxd/outbox/outboxdriver/outboxsqlite v0.1.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	modernc.org/libc v1.80.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.12.1 // indirect
	modernc.org/sqlite v1.62.0 // indirect
)

// The project's own modules, from this checkout (a release replaces nothing:
// these lines are ignored where this module is a dependency).
replace (
	github.com/outboxd/outbox => ../..
	github.com/outboxd/outbox/broker/brokertest => ../../broker/brokertest
	github.com/outboxd/outbox/broker/kafka => ../../broker/kafka
	github.com/outboxd/outbox/broker/nats => ../../broker/nats
	github.com/outboxd/outbox/broker/webhook => ../../broker/webhook
	github.com/outboxd/outbox/inbox => ..
	github.com/outboxd/outbox/internal/natsembed => ../../internal/natsembed
	github.com/outboxd/outbox/outboxdriver/outboxmysql => ../../outboxdriver/outboxmysql
	github.com/outboxd/outbox/outboxdriver/outboxsqlite => ../../outboxdriver/outboxsqlite
	github.com/outboxd/outbox/relay => ../../relay
)
