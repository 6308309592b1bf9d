package pgcdc_test

import (
	"context"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

// Run the relay in CDC mode: the outbox table's committed inserts come from a logical
// replication slot (pgoutput) instead of polling, and the slot's position moves only
// after the broker acknowledged them. PostgreSQL needs wal_level=logical; Init creates
// the publication and the slot once (`outbox migrate --cdc` does the same).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://app@db:5432/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	src, err := pgcdc.ForDriver(outboxpgx.New(pool, nil), &pgcdc.Config{})
	if err != nil {
		panic(err)
	}
	if err := src.Init(ctx); err != nil {
		panic(err)
	}

	nc, err := nats.Connect("nats://nats:4222")
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	pub, err := natspub.New(js, nil)
	if err != nil {
		panic(err)
	}
	r, err := relay.New(src, pub, nil)
	if err != nil {
		panic(err)
	}
	// Until interrupted; a second relay on the same table waits as a hot standby.
	if err := r.Run(ctx); err != nil && ctx.Err() == nil {
		panic(err)
	}
}
