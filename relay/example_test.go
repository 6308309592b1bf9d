package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/relay"
)

// Embed the relay in a service: it publishes the outbox's committed events, in order
// per aggregate, to a publisher (here the in-memory one; broker/nats, broker/kafka and
// the others plug in the same way) until it is stopped.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-relay-example")
	defer os.RemoveAll(dir)
	db, err := outboxsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	store := outboxsqlite.New(db, nil)
	m, _ := store.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		panic(err)
	}

	// The service writes events in its own transactions.
	w, err := outbox.NewWriter(store, nil)
	if err != nil {
		panic(err)
	}
	if err := w.Write(ctx,
		outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{"total":990}`)},
		outbox.Event{AggregateType: "order", AggregateID: "7", Type: "OrderPlaced", Payload: []byte(`{"total":120}`)},
		outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderShipped", Payload: []byte(`{}`)},
	); err != nil {
		panic(err)
	}

	// The relay ships them.
	pub := memory.New(0)
	r, err := relay.New(store, pub, &relay.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := pub.Wait(wctx, "outbox.event.order", 3)
	if err != nil {
		panic(err)
	}
	if err := r.Stop(ctx); err != nil {
		panic(err)
	}

	// In order per aggregate (the key); aggregates may interleave.
	slices.SortStableFunc(msgs, func(a, b broker.Message) int { return strings.Compare(a.Key, b.Key) })
	for _, m := range msgs {
		fmt.Println(m.Topic, m.Key, m.EventType)
	}
	// Output:
	// outbox.event.order 42 OrderPlaced
	// outbox.event.order 42 OrderShipped
	// outbox.event.order 7 OrderPlaced
}
