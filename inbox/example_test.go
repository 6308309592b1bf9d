package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

// Consume at-least-once deliveries exactly once: Handle records the event and runs
// the handler in one transaction, so a redelivery changes nothing, and with the
// version guard an event older than one already applied for its aggregate is skipped.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-inbox-example")
	defer os.RemoveAll(dir)
	db, err := outboxsqlite.Open(filepath.Join(dir, "billing.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE invoices (order_id TEXT PRIMARY KEY)`); err != nil {
		panic(err)
	}
	ib, err := inbox.NewSQL(db, inbox.SQLite, &inbox.Config{VersionGuard: true})
	if err != nil {
		panic(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		panic(err)
	}

	invoice := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id) VALUES ('42')`)
		return err
	}
	// Messages as a broker adapter (natsinbox, kafkainbox, ...) builds them from the
	// relay's headers: the event id, and the outbox sequence as the version.
	placed := &inbox.Message{ID: "0192f0c4-0000-7000-8000-000000000002", AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Seq: 2}
	older := &inbox.Message{ID: "0192f0c4-0000-7000-8000-000000000001", AggregateType: "order", AggregateID: "42", Type: "OrderDrafted", Seq: 1}
	for _, m := range []*inbox.Message{placed, placed, older} {
		outcome, err := ib.Handle(ctx, "billing", m, invoice)
		if err != nil {
			panic(err)
		}
		fmt.Println(m.Type, outcome)
	}
	var n int
	_ = db.QueryRow(`SELECT count(*) FROM invoices`).Scan(&n)
	fmt.Println("invoices:", n)
	// Output:
	// OrderPlaced processed
	// OrderPlaced duplicate
	// OrderDrafted stale
	// invoices: 1
}

// An adapter for a broker the project has no helper for builds the inbox's Message
// from the wire format's headers (any case) and the body.
func ExampleFromHeaders() {
	m := inbox.FromHeaders(map[string]string{
		"id": "0192f0c4-0000-7000-8000-000000000001", "eventType": "OrderPlaced",
		"aggregateType": "order", "aggregateId": "42", "Outbox-Seq": "7",
	}, []byte(`{"total":990}`))
	fmt.Println(m.ID, m.AggregateType, m.AggregateID, m.Type, m.Seq, m.Late(), string(m.Payload))
	// Output: 0192f0c4-0000-7000-8000-000000000001 order 42 OrderPlaced 7 false {"total":990}
}
