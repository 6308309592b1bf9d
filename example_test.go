package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

// Write an order and its event in one transaction: the event exists if and only if the
// order does. (outboxsqlite's example runs the same on SQLite, with its output.)
func ExampleWriter_WriteTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	w, err := outbox.NewWriter(outboxpgx.New(pool, nil), nil)
	if err != nil {
		panic(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES ('42', 990)`); err != nil {
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
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Println("event id:", events[0].ID)
}

// An invalid event is refused before anything is written (here, before the pool
// opens its first connection), with an error saying which event and field.
func ExampleEventError() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	w, _ := outbox.NewWriter(outboxpgx.New(pool, nil), nil)

	err = w.Write(context.Background(),
		outbox.Event{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: []byte(`{}`)},
		outbox.Event{AggregateType: "order", AggregateID: "2", Type: "OrderPlaced", Payload: []byte(`not json`)},
	)
	var evErr *outbox.EventError
	fmt.Println(errors.Is(err, outbox.ErrInvalidEvent), errors.As(err, &evErr) && evErr.Index == 1)
	fmt.Println(err)
	// Output:
	// true true
	// outbox: event 1: Payload: not valid JSON (the payload column holds JSON; use a bytes payload column for other data)
}
