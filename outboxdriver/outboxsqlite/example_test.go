package outboxsqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// Write an order and its event in one transaction on SQLite: the event exists if and
// only if the order does.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, err := outboxsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	m, _ := outboxsqlite.New(db, nil).Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER)`); err != nil {
		panic(err)
	}

	w, err := outbox.NewWriter(outboxsqlite.New(db, nil), nil)
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total_cents) VALUES ('42', 990)`); err != nil {
		panic(err)
	}
	events := []outbox.Event{{
		AggregateType: "order", // published to outbox.event.order
		AggregateID:   "42",    // the message key
		Type:          "OrderPlaced",
		Payload:       []byte(`{"eventVersion":1,"orderId":"42","totalCents":990}`),
		Headers:       map[string]string{outbox.HeaderCorrelationID: "req-7"},
	}}
	if err := w.WriteTx(ctx, tx, events...); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	var n int
	_ = db.QueryRow(`SELECT count(*) FROM outbox WHERE aggregateid = '42'`).Scan(&n)
	fmt.Println("events in the outbox:", n, "- id set:", events[0].ID != "")
	// Output: events in the outbox: 1 - id set: true
}
