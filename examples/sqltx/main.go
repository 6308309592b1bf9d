// Command sqltx is outbox for a service built on database/sql, as most ORMs are (the
// pgx stdlib driver here): an order row and its OrderPlaced event are written in one
// *sql.Tx through the outboxsql driver, once with database/sql itself and once inside
// a GORM transaction, whose *sql.Tx is tx.Statement.ConnPool.(*sql.Tx); a GORM
// transaction that fails leaves no event. A relay in the same process publishes the
// events to NATS.
//
//	go run ./examples/sqltx -db postgres://postgres@127.0.0.1:5432/test -nats nats://127.0.0.1:4222
//
// Bun hands out the same *sql.Tx (bun.Tx's Tx field); so do sqlx (sqlx.Tx embeds it)
// and ent (through its sql driver).
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

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
	ids, err := run(ctx, *dbURL, *natsURL, setup{schema: "public", topics: "outbox.event.${aggregatetype}"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sqltx:", err)
		os.Exit(1)
	}
	fmt.Printf("orders %d (database/sql) and %d (GORM) placed and their OrderPlaced events published to outbox.event.order\n", ids[0], ids[1])
}

// setup is where the example writes and publishes (a test gives its own).
type setup struct {
	schema string // the orders and outbox tables' schema
	topics string // the relay's topic template
	stream string // the JetStream stream to create when none covers the topics ("": the default)
}

// order is the business row, as GORM maps it.
type order struct {
	ID         int64
	TotalCents int
}

// errCardDeclined fails the GORM transaction the example rolls back.
var errCardDeclined = errors.New("card declined")

// run places two orders, one with database/sql and one with GORM, tries a third whose
// GORM transaction fails, and returns the two placed orders' ids once the relay has
// published their events.
func run(ctx context.Context, dbURL, natsURL string, s setup) ([2]int64, error) {
	var ids [2]int64
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		return ids, err
	}
	defer db.Close()
	drv := outboxsql.New(db, &outboxdriver.Table{Schema: s.schema})
	m, err := drv.Migrator()
	if err != nil {
		return ids, err
	}
	if _, err := m.Migrate(ctx); err != nil { // a real service runs `outbox migrate` at deploy time
		return ids, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.schema+`.orders (id bigserial PRIMARY KEY, total_cents int NOT NULL)`); err != nil {
		return ids, err
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		return ids, err
	}

	// The relay, embedded; it could as well be the `outbox relay` command.
	cfg := &nats.Config{CreateStream: true}
	if s.stream != "" {
		cfg.StreamName, cfg.StreamSubjects = s.stream, []string{s.stream + ".>"}
	}
	pub, err := nats.Dial(ctx, natsURL, cfg)
	if err != nil {
		return ids, err
	}
	defer pub.Close()
	store, err := drv.Store()
	if err != nil {
		return ids, err
	}
	r, err := relay.New(store, pub, &relay.Config{Logger: slog.Default(), TopicTemplate: s.topics})
	if err != nil {
		return ids, err
	}
	if err := r.Start(ctx); err != nil {
		return ids, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}()

	// Place an order: the business row and its event in one *sql.Tx.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return ids, err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := tx.QueryRowContext(ctx, `INSERT INTO `+s.schema+`.orders (total_cents) VALUES (990) RETURNING id`).Scan(&ids[0]); err != nil {
		return ids, err
	}
	if err := w.WriteTx(ctx, tx, orderPlaced(ids[0], 990)); err != nil {
		return ids, err
	}
	if err := tx.Commit(); err != nil {
		return ids, err
	}

	// The same with GORM, on the same *sql.DB: its transaction's *sql.Tx carries the
	// event, so the order and its event commit or roll back together.
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: db}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return ids, err
	}
	orders := gdb.Table(s.schema + ".orders")
	err = orders.Transaction(func(gtx *gorm.DB) error {
		o := order{TotalCents: 1250}
		if err := gtx.Create(&o).Error; err != nil {
			return err
		}
		ids[1] = o.ID
		return w.WriteTx(ctx, gtx.Statement.ConnPool.(*sql.Tx), orderPlaced(o.ID, 1250))
	})
	if err != nil {
		return ids, err
	}
	// A GORM transaction that fails after writing its event: neither the order nor the
	// event is committed, and nothing is ever published for it.
	err = orders.Transaction(func(gtx *gorm.DB) error {
		o := order{TotalCents: 99_999}
		if err := gtx.Create(&o).Error; err != nil {
			return err
		}
		if err := w.WriteTx(ctx, gtx.Statement.ConnPool.(*sql.Tx), orderPlaced(o.ID, 99_999)); err != nil {
			return err
		}
		return errCardDeclined
	})
	if !errors.Is(err, errCardDeclined) {
		return ids, fmt.Errorf("the failing GORM transaction: %v", err)
	}

	for r.Stats().Published < 2 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	return ids, ctx.Err()
}

func orderPlaced(id int64, totalCents int) outbox.Event {
	payload, _ := json.Marshal(map[string]any{"eventVersion": 1, "orderId": id, "totalCents": totalCents})
	return outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(id), Type: "OrderPlaced", Payload: payload}
}
