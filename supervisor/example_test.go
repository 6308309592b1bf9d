package supervisor_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/supervisor"
)

// Run the relays of two outbox tables in one service: each table is relayed as it
// would be alone (its own leadership, its order per aggregate), with one registry,
// one readiness probe and one dashboard (Handler) for both.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-supervisor-example")
	defer os.RemoveAll(dir)
	db, err := outboxsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	orders := outboxdriver.Table{Schema: "main", Name: "orders_outbox"}
	payments := outboxdriver.Table{Schema: "main", Name: "payments_outbox"}
	for _, t := range []outboxdriver.Table{orders, payments} {
		writeEvent(ctx, db, t, outbox.Event{AggregateType: t.Name, AggregateID: "1", Type: "Created", Payload: []byte(`{}`)})
	}

	pub := memory.New(0)
	sup, err := supervisor.New(&supervisor.Config{
		Tables:    []outboxdriver.Table{orders, payments},
		Publisher: pub,
		Open: func(_ context.Context, t outboxdriver.Table) (*supervisor.Table, error) {
			store, err := outboxsqlite.New(db, &outboxsqlite.Options{Table: t}).Store()
			if err != nil {
				return nil, err
			}
			return &supervisor.Table{Source: store, Store: store}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sup.Run(rctx) }()

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var msgs []broker.Message
	for _, topic := range []string{"outbox.event.orders_outbox", "outbox.event.payments_outbox"} {
		got, err := pub.Wait(wctx, topic, 1)
		if err != nil {
			panic(err)
		}
		msgs = append(msgs, got...)
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	slices.SortFunc(msgs, func(a, b broker.Message) int { return strings.Compare(a.Topic, b.Topic) })
	for _, m := range msgs {
		fmt.Println(m.Topic, m.Key, m.EventType)
	}
	// Output:
	// outbox.event.orders_outbox 1 Created
	// outbox.event.payments_outbox 1 Created
}

// writeEvent creates table t if it is not there and writes e to it.
func writeEvent(ctx context.Context, db *sql.DB, t outboxdriver.Table, e outbox.Event) {
	drv := outboxsqlite.New(db, &outboxsqlite.Options{Table: t})
	m, err := drv.Migrator()
	if err != nil {
		panic(err)
	}
	if _, err := m.Migrate(ctx); err != nil {
		panic(err)
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		panic(err)
	}
	if err := w.Write(ctx, e); err != nil {
		panic(err)
	}
}
