package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/inbox/natsinbox"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// unackedCrash is how many messages the billing service applies but does not
// acknowledge, once, as if it crashed between commit and ack; JetStream redelivers
// them and the inbox must skip them.
const unackedCrash = 25

// billing is the consuming service: it applies each OrderPlaced event once, however
// often it is delivered, through the inbox package (the event id recorded in the same
// transaction as the invoice).
type billing struct {
	db *sql.DB
	ib *inbox.Inbox[*sql.Tx]
	d  *demo

	mu        sync.Mutex
	seen      map[string]bool // applied event ids, for the phantom check
	unacked   int
	crashDone bool
}

func newBilling(ctx context.Context, path string, d *demo) (*billing, error) {
	db, err := outboxsqlite.Open(path)
	if err != nil {
		return nil, err
	}
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS invoices (order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS customer_progress (customer_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	ib, err := inbox.NewSQL(db, inbox.SQLite, nil)
	if err == nil {
		err = ib.Migrate(ctx)
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &billing{db: db, ib: ib, d: d, seen: map[string]bool{}}, nil
}

func (b *billing) close() { _ = b.db.Close() }

func (b *billing) consume(ctx context.Context, js jetstream.JetStream) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, "OUTBOX", jetstream.ConsumerConfig{
		Durable:   consumerName,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   time.Second,
	})
	if err != nil {
		return fmt.Errorf("billing consumer: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	start := time.Now()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			return err
		}
		if err := b.handle(ctx, msg); err != nil {
			// Not acknowledged: JetStream delivers it again.
			b.d.log.Warn("billing: handler failed", "err", err)
			_ = msg.Nak()
			continue
		}
		if b.crashBeforeAck(time.Since(start)) {
			continue
		}
		_ = msg.Ack()
	}
}

// crashBeforeAck plays, once, a consumer that dies after its commit and before its ack.
func (b *billing) crashBeforeAck(elapsed time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.crashDone || elapsed < b.d.cfg.Duration*3/4 {
		return false
	}
	b.unacked++
	if b.unacked == unackedCrash {
		b.crashDone = true
	}
	return true
}

// unackedCount is how many applied messages were left unacknowledged.
func (b *billing) unackedCount() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(b.unacked)
}

// handle applies one event through the inbox: once, whatever the deliveries.
func (b *billing) handle(ctx context.Context, msg jetstream.Msg) error {
	m := natsinbox.Message(msg)
	var ev orderEvent
	if err := json.Unmarshal(m.Payload, &ev); err != nil {
		return fmt.Errorf("event %s: %w", m.ID, err)
	}
	outcome, err := b.ib.Handle(ctx, consumerName, &m, func(ctx context.Context, tx *sql.Tx) error {
		var last int
		err := tx.QueryRowContext(ctx, `SELECT last_seq FROM customer_progress WHERE customer_id = ?`, ev.CustomerID).Scan(&last)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if ev.Seq != last+1 {
			b.d.outOfOrder.Add(1)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO customer_progress (customer_id, last_seq) VALUES (?, ?)
			ON CONFLICT (customer_id) DO UPDATE SET last_seq = excluded.last_seq`, ev.CustomerID, ev.Seq); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO invoices (order_id, customer_id, amount_cents) VALUES (?, ?, ?)`,
			ev.OrderID, ev.CustomerID, ev.AmountCents)
		return err
	})
	if err != nil {
		return err
	}
	if outcome != inbox.Processed {
		b.d.redelivered.Add(1) // applied before: nothing else was done
		return nil
	}
	b.mu.Lock()
	b.seen[m.ID] = true
	b.mu.Unlock()
	b.d.consumed.Add(1)
	b.d.latMu.Lock()
	b.d.latencies = append(b.d.latencies, time.Since(time.Unix(0, ev.CommittedAt)))
	b.d.latMu.Unlock()
	return nil
}

// phantoms counts applied events that no committed transaction wrote.
func (b *billing) phantoms(committed map[string]string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n int64
	for id := range b.seen {
		if _, ok := committed[id]; !ok {
			n++
		}
	}
	return n
}
