// Command orderservice is the smallest real use of outbox with PostgreSQL and NATS: it
// places an order and its OrderPlaced event in one transaction, and runs the relay in
// the same process. Run it against the services of your machine:
//
//	go run ./examples/orderservice -db postgres://postgres@127.0.0.1:5432/test -nats nats://127.0.0.1:4222
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
)

func main() {
	dbURL := flag.String("db", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	natsURL := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dbURL, *natsURL); err != nil {
		fmt.Fprintln(os.Stderr, "orderservice:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL, natsURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	drv := outboxpgx.New(pool, nil)
	m, err := drv.Migrator()
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx); err != nil { // a real service runs `outbox migrate` at deploy time
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, total_cents int NOT NULL)`); err != nil {
		return err
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		return err
	}

	// The relay, embedded. It could as well be the `outbox relay` command.
	pub, err := nats.Dial(ctx, natsURL, &nats.Config{CreateStream: true})
	if err != nil {
		return err
	}
	defer pub.Close()
	store, err := drv.Store()
	if err != nil {
		return err
	}
	r, err := relay.New(store, pub, &relay.Config{Logger: slog.Default()})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}()

	// Place an order: the business row and its event in one transaction.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (total_cents) VALUES (990) RETURNING id`).Scan(&id); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"eventVersion": 1, "orderId": id, "totalCents": 990})
		return w.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(id), Type: "OrderPlaced", Payload: payload})
	})
	if err != nil {
		return err
	}
	for r.Stats().Published == 0 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("order placed and its event published to outbox.event.order")
	return nil
}
