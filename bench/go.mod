module github.com/outboxd/outbox/bench

go 1.26.0

toolchain go1.26.8

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/ThreeDotsLabs/watermill-nats/v2 v2.1.3
	github.com/ThreeDotsLabs/watermill-sql/v4 v4.1.2
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	gonum.org/v1/plot v0.17.0
)

require (
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1
	github.com/outboxd/outbox v0.1.0
	github.com/outboxd/outbox/broker/nats v0.1.0
	github.com/outboxd/outbox/broker/webhook v0.1.0
	github.com/outboxd/outbox/pgcdc v0.1.0
	github.com/outboxd/outbox/relay v0.1.0
	github.com/outboxd/outbox/replay v0.1.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/lib/pq v1.10.9 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker v1.0.0 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)

// The project's own modules, from this checkout (a release replaces nothing:
// these lines are ignored where this module is a dependency).
replace (
	github.com/outboxd/outbox => ..
	github.com/outboxd/outbox/broker/brokertest => ../broker/brokertest
	github.com/outboxd/outbox/broker/kafka => ../broker/kafka
	github.com/outboxd/outbox/broker/nats => ../broker/nats
	github.com/outboxd/outbox/broker/webhook => ../broker/webhook
	github.com/outboxd/outbox/inbox => ../inbox
	github.com/outboxd/outbox/inbox/kafkainbox => ../inbox/kafkainbox
	github.com/outboxd/outbox/inbox/natsinbox => ../inbox/natsinbox
	github.com/outboxd/outbox/internal/natsembed => ../internal/natsembed
	github.com/outboxd/outbox/outboxdriver/outboxmysql => ../outboxdriver/outboxmysql
	github.com/outboxd/outbox/outboxdriver/outboxsqlite => ../outboxdriver/outboxsqlite
	github.com/outboxd/outbox/pgcdc => ../pgcdc
	github.com/outboxd/outbox/relay => ../relay
	github.com/outboxd/outbox/replay => ../replay
)
