// Command sqltx is outbox for a service built on database/sql, as most ORMs are (the
// pgx stdlib driver here; GORM, Bun, sqlx and ent hand out the same *sql.Tx): the
// order row and its OrderPlaced event are written in one *sql.Tx through the
// outboxsql driver, and a relay in the same process publishes the event to NATS.
//
//	go run ./examples/sqltx -db postgres://postgres@127.0.0.1:5432/test -nats nats://127.0.0.1:4222
//
// With GORM, take the *sql.Tx of a transaction with tx.Statement.ConnPool.(*sql.Tx);
// with Bun, bun.Tx's Tx field; with sqlx, sqlx.Tx embeds it.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxsql"
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
		fmt.Fprintln(os.Stderr, "sqltx:", err)
		os.Exit(1)
	}
	fmt.Printf("order %d placed and its OrderPlaced event published to outbox.event.order\n", id)
}

// setup is where the example writes and publishes (a test gives its own).
type setup struct {
	schema string // the orders and outbox tables' schema
	topics string // the relay's topic template
	stream string // the JetStream stream to create when none covers the topics ("": the default)
}

// run places one order and returns once the relay has published its event.
func run(ctx context.Context, dbURL, natsURL string, s setup) (int64, error) {
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	drv := outboxsql.New(db, &outboxdriver.Table{Schema: s.schema})
	m, err := drv.Migrator()
	if err != nil {
		return 0, err
	}
	if _, err := m.Migrate(ctx); err != nil { // a real service runs `outbox migrate` at deploy time
		return 0, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.schema+`.orders (id bigserial PRIMARY KEY, total_cents int NOT NULL)`); err != nil {
		return 0, err
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		return 0, err
	}

	// The relay, embedded; it could as well be the `outbox relay` command.
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

	// Place an order: the business row and its event in one *sql.Tx.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var id int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO `+s.schema+`.orders (total_cents) VALUES (990) RETURNING id`).Scan(&id); err != nil {
		return 0, err
	}
	payload, _ := json.Marshal(map[string]any{"eventVersion": 1, "orderId": id, "totalCents": 990})
	if err := w.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(id), Type: "OrderPlaced", Payload: payload}); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	for r.Stats().Published == 0 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	return id, ctx.Err()
}
