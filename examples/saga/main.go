// Command saga is a saga across three services, each with its own database schema,
// outbox and inbox, talking only through NATS JetStream:
//
//	order     places an order (PENDING) and its OrderPlaced event in one transaction
//	payment   on OrderPlaced: charges up to the limit -> PaymentCompleted, else PaymentFailed
//	shipping  on PaymentCompleted: schedules the shipment -> ShipmentScheduled
//	order     on ShipmentScheduled: SHIPPED; on PaymentFailed: CANCELLED (the compensation)
//
// Every state change and the event it causes commit together (outbox), and every event
// is applied once (inbox), however often NATS delivers it. The three run in one process
// here for the example's sake; each could be its own deployment with its own relay.
//
//	go run ./examples/saga -db postgres://postgres@127.0.0.1:5432/test -nats nats://127.0.0.1:4222
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/inbox/natsinbox"
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
	states, err := run(ctx, *dbURL, *natsURL, "saga", []int{500, 5000})
	if err != nil {
		fmt.Fprintln(os.Stderr, "saga:", err)
		os.Exit(1)
	}
	for id, st := range states {
		fmt.Printf("order %d: %s\n", id, st)
	}
}

// paymentLimit is what the payment service accepts; a larger order's payment fails.
const paymentLimit = 1000

// event is every message of the saga (a real system would have one type each).
type event struct {
	OrderID int64  `json:"orderId"`
	Amount  int    `json:"amount,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// service is one service: its schema (tables, outbox, inbox), its writer and relay.
type service struct {
	name string
	pool *pgxpool.Pool
	w    *outbox.Writer[pgx.Tx]
	ib   *inbox.Inbox[pgx.Tx]
}

// run places one order per amount and returns each order's final state. prefix names
// the schemas (<prefix>_order, ...), the stream and its subjects (<prefix>.<aggregate>).
func run(ctx context.Context, dbURL, natsURL, prefix string, amounts []int) (map[int64]string, error) {
	nc, err := natsgo.Connect(natsURL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}}); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 16)
	var consumers sync.WaitGroup
	var stops []func() // relays and pools, closed once the consumers are done
	defer func() {
		cancel()
		consumers.Wait()
		for _, stop := range slices.Backward(stops) {
			stop()
		}
	}()
	svc := map[string]*service{}
	for _, name := range []string{"order", "payment", "shipping"} {
		s, stop, err := start(ctx, dbURL, natsURL, prefix, name, errs)
		if err != nil {
			return nil, err
		}
		stops = append(stops, stop)
		svc[name] = s
	}
	order, payment, shipping := svc["order"], svc["payment"], svc["shipping"]
	// Each handler changes its service's state and writes the next event in the inbox's
	// transaction: applied once, and the event leaves only if the change commits.
	consume := func(s *service, aggregate string, fn func(ctx context.Context, tx pgx.Tx, m *inbox.Message, e event) error) {
		cons, err := js.CreateOrUpdateConsumer(ctx, prefix, jetstream.ConsumerConfig{
			Durable: prefix + "_" + s.name + "_" + aggregate, FilterSubject: prefix + "." + aggregate, AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			errs <- err
			return
		}
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			errs <- natsinbox.Consume(ctx, cons, s.ib, s.name, func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
				var e event
				if err := json.Unmarshal(m.Payload, &e); err != nil {
					return inbox.Permanent(err)
				}
				return fn(ctx, tx, m, e)
			}, nil)
		}()
	}
	consume(payment, "order", func(ctx context.Context, tx pgx.Tx, m *inbox.Message, e event) error {
		if m.Type != "OrderPlaced" {
			return nil
		}
		next := event{OrderID: e.OrderID}
		typ, status := "PaymentCompleted", "CHARGED"
		if e.Amount > paymentLimit {
			typ, status, next.Reason = "PaymentFailed", "DECLINED", fmt.Sprintf("amount %d over the limit %d", e.Amount, paymentLimit)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, amount, status) VALUES ($1, $2, $3)`, e.OrderID, e.Amount, status); err != nil {
			return err
		}
		return payment.emit(ctx, tx, "payment", typ, next)
	})
	consume(shipping, "payment", func(ctx context.Context, tx pgx.Tx, m *inbox.Message, e event) error {
		if m.Type != "PaymentCompleted" {
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, e.OrderID); err != nil {
			return err
		}
		return shipping.emit(ctx, tx, "shipment", "ShipmentScheduled", event{OrderID: e.OrderID})
	})
	settle := func(status string) func(ctx context.Context, tx pgx.Tx, m *inbox.Message, e event) error {
		return func(ctx context.Context, tx pgx.Tx, m *inbox.Message, e event) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = $2 WHERE id = $1 AND status = 'PENDING'`, e.OrderID, status)
			return err
		}
	}
	consume(order, "shipment", settle("SHIPPED"))
	consume(order, "payment", func(ctx context.Context, tx pgx.Tx, m *inbox.Message, e event) error {
		if m.Type != "PaymentFailed" {
			return nil
		}
		return settle("CANCELLED")(ctx, tx, m, e) // the compensation
	})

	// Place the orders: each row and its OrderPlaced event in one transaction.
	ids := make([]int64, 0, len(amounts))
	for _, amount := range amounts {
		err := pgx.BeginFunc(ctx, order.pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO orders (amount, status) VALUES ($1, 'PENDING') RETURNING id`, amount).Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
			return order.emit(ctx, tx, "order", "OrderPlaced", event{OrderID: id, Amount: amount})
		})
		if err != nil {
			return nil, err
		}
	}
	// Wait for every order to settle.
	for {
		states := map[int64]string{}
		rows, err := order.pool.Query(ctx, `SELECT id, status FROM orders WHERE id = ANY($1) AND status <> 'PENDING'`, ids)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id int64
			var st string
			if err := rows.Scan(&id, &st); err != nil {
				return nil, err
			}
			states[id] = st
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if len(states) == len(ids) {
			return states, nil
		}
		select {
		case err := <-errs:
			if err != nil {
				return nil, err
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("orders still pending: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// start gives a service its schema, tables, outbox, inbox and relay.
func start(ctx context.Context, dbURL, natsURL, prefix, name string, errs chan<- error) (*service, func(), error) {
	schema := prefix + "_" + name
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema // the service's tables, inbox included
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	ddl := map[string]string{
		"order":    `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, amount int NOT NULL, status text NOT NULL)`,
		"payment":  `CREATE TABLE IF NOT EXISTS payments (order_id bigint PRIMARY KEY, amount int NOT NULL, status text NOT NULL)`,
		"shipping": `CREATE TABLE IF NOT EXISTS shipments (order_id bigint PRIMARY KEY)`,
	}[name]
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		pool.Close()
		return nil, nil, err
	}
	if _, err := pool.Exec(ctx, ddl); err != nil {
		pool.Close()
		return nil, nil, err
	}
	drv := outboxpgx.New(pool, &outboxdriver.Table{Schema: schema})
	m, err := drv.Migrator()
	if err == nil {
		_, err = m.Migrate(ctx)
	}
	s := &service{name: name, pool: pool}
	if err == nil {
		s.w, err = outbox.NewWriter(drv, nil)
	}
	if err == nil {
		s.ib, err = inbox.NewPgx(pool, nil)
	}
	if err == nil {
		err = s.ib.Migrate(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	pub, err := nats.Dial(ctx, natsURL, nil)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	store, _ := drv.Store()
	r, err := relay.New(store, pub, &relay.Config{TopicTemplate: prefix + ".${aggregatetype}",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err == nil {
		err = r.Start(ctx)
	}
	if err != nil {
		_ = pub.Close()
		pool.Close()
		return nil, nil, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(sctx); err != nil && !errors.Is(err, context.Canceled) {
			errs <- err
		}
		_ = pub.Close()
		pool.Close()
	}
	return s, stop, nil
}

// emit writes the service's next event in tx.
func (s *service) emit(ctx context.Context, tx pgx.Tx, aggregate, typ string, e event) error {
	payload, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.w.WriteTx(ctx, tx, outbox.Event{AggregateType: aggregate, AggregateID: fmt.Sprint(e.OrderID), Type: typ, Payload: payload})
}
