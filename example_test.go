package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// openExampleDB opens a throwaway SQLite database with the outbox table and an orders
// table, standing in for the application's own database.
func openExampleDB() (*sql.DB, func()) {
	dir, _ := os.MkdirTemp("", "outbox-example")
	db, err := outboxsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		panic(err)
	}
	m, _ := outboxsqlite.New(db, nil).Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, total_cents INTEGER)`); err != nil {
		panic(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// Write an order and its event in one transaction: the event exists if and only if the
// order does.
func ExampleWriter_WriteTx() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()

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

// An invalid event is refused before anything is written, with an error saying which
// event and field.
func ExampleEventError() {
	db, cleanup := openExampleDB()
	defer cleanup()
	w, _ := outbox.NewWriter(outboxsqlite.New(db, nil), nil)

	err := w.Write(context.Background(),
		outbox.Event{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "order", AggregateID: "2", Type: "OrderPlaced", Payload: []byte(`not json`)},
	)
	var evErr *outbox.EventError
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent), errors.As(err, &evErr) && evErr.Index == 1)
	fmt.Println(err)

	var n int
	_ = db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&n)
	fmt.Println("rows written:", n)
	// Output:
	// true true
	// outbox: event 1: Payload: not valid JSON (the payload column holds JSON; use a bytes payload column for other data)
	// rows written: 0
}
