package replay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/broker"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/replay"
)

// Send a day of one aggregate type's published history again, in order, to a topic of
// its own (a new consumer's, or one rebuilding its state), without disturbing live
// delivery. The run is checkpointed under its name: interrupted, it continues where
// it stopped; its events carry the outbox-replay header and a dedup id of their own.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db:5432/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
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
	topic, err := broker.ParseTemplate("rebuild.${aggregatetype}")
	if err != nil {
		panic(err)
	}
	res, err := replay.New(pool, outboxdriver.Table{}).Run(ctx, pub, &replay.Config{
		Name:   "search-index-rebuild",
		Filter: replay.Filter{Since: time.Now().Add(-24 * time.Hour), AggregateType: "order"},
		Topic:  topic,
		Rate:   2000, // events per second, to spare the consumer
	})
	if err != nil {
		panic(err)
	}
	fmt.Printf("sent %d events (resumed: %v)\n", res.Sent, res.Resumed)
}

// The --since and --until of `outbox replay`: a time in RFC 3339, or a duration
// before now.
func ExampleParseWhen() {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"2026-11-30T00:00:00Z", "36h", "yesterday"} {
		t, err := replay.ParseWhen(s, now)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(t.Format(time.RFC3339))
	}
	// Output:
	// 2026-11-30T00:00:00Z
	// 2026-12-05T00:00:00Z
	// "yesterday": want RFC 3339 (2026-11-30T00:00:00Z) or a duration ago (24h)
}
