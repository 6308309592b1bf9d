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
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
)

func main() {
	dbURL := flag.String("db", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	natsURL := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	id, err := run(ctx, *dbURL, *natsURL, setup{schema: "public", topics: "outbox.event.${aggregatetype}"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "orderservice:", err)
		os.Exit(1)
	}
	fmt.Printf("order %d placed and its event published to outbox.event.order\n", id)
}

// setup is where the example writes and publishes (a test gives its own).
type setup struct {
	schema string // the orders and outbox tables' schema
	topics string // the relay's topic template
	stream string // the JetStream stream to create when none covers the topics ("": the default)
}

// run places one order and returns its id once the relay has published its event.
func run(ctx context.Context, dbURL, natsURL string, s setup) (int64, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	drv := outboxpgx.New(pool, &outboxdriver.Table{Schema: s.schema})
	m, err := drv.Migrator()
	if err != nil {
		return 0, err
	}
	if _, err := m.Migrate(ctx); err != nil { // a real service runs `outbox migrate` at deploy time
		return 0, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.schema+`.orders (id bigserial PRIMARY KEY, total_cents int NOT NULL)`); err != nil {
		return 0, err
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		return 0, err
	}

	// The relay, embedded. It could as well be the `outbox relay` command.
	cfg := &nats.Config{CreateStream: true}
	if s.stream != "" {
		cfg.StreamName, cfg.StreamSubjects = s.stream, []string{s.stream + ".>"}
	}
	pub, err := nats.Dial(ctx, natsURL, cfg)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	store, err := drv.Store()
	if err != nil {
		return 0, err
	}
	r, err := relay.New(store, pub, &relay.Config{Logger: slog.Default(), TopicTemplate: s.topics})
	if err != nil {
		return 0, err
	}
	if err := r.Start(ctx); err != nil {
		return 0, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}()

	// Place an order: the business row and its event in one transaction.
	var id int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO `+s.schema+`.orders (total_cents) VALUES (990) RETURNING id`).Scan(&id); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"eventVersion": 1, "orderId": id, "totalCents": 990})
		return w.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(id), Type: "OrderPlaced", Payload: payload})
	})
	if err != nil {
		return 0, err
	}
	for r.Stats().Published == 0 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	return id, ctx.Err()
}
