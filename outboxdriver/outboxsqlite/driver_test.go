package outboxsqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[*sql.Tx] {
		t.Helper()
		db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "test.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return &outboxdrivertest.Harness[*sql.Tx]{
			Driver:   outboxsqlite.New(db, &outboxsqlite.Options{Table: outboxdriver.Table{Payload: payload}}),
			Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
			Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
			InsertPlain: func(ctx context.Context, id, at, aid, typ, payload string) error {
				_, err := db.ExecContext(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, ?, ?, ?, ?)`, id, at, aid, typ, payload)
				return err
			},
			Reopen: func(t outboxdriver.Table) outboxdriver.Driver[*sql.Tx] {
				return outboxsqlite.New(db, &outboxsqlite.Options{Table: t})
			},
			MultipleClaims: true,
		}
	})
}

func TestSchemaRefused(t *testing.T) {
	d := outboxsqlite.New(nil, &outboxsqlite.Options{Table: outboxdriver.Table{Schema: "public"}})
	if d.Err() == nil {
		t.Fatal("a schema was accepted for SQLite")
	}
}

// TestDeadLetterFromAClockAhead: a dead letter written by a relay whose wall clock is
// ahead (another host, an NTP step) is listed, replayed and purged at once by a reader
// whose clock is not: "dead for at least" is applied only when asked. The simulator
// found it (docs/testing.md, track record).
func TestDeadLetterFromAClockAhead(t *testing.T) {
	ctx := context.Background()
	db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "test.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ahead := outboxsqlite.New(db, &outboxsqlite.Options{Clock: func() time.Time { return time.Now().Add(time.Hour) }})
	reader := outboxsqlite.New(db, nil)
	m, _ := reader.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(outboxdriver.Driver[*sql.Tx](reader), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	relayStore, _ := ahead.Store()
	c, err := relayStore.Claim(ctx, &outboxdriver.ClaimParams{Limit: 1})
	if err != nil || len(c.Rows()) != 1 {
		t.Fatalf("claim: %v", err)
	}
	id := c.Rows()[0].ID
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{{ID: id, Error: "refused", CountAttempt: true, Dead: true}}}); err != nil {
		t.Fatal(err)
	}
	store, _ := reader.Store()
	dead, err := store.ListDead(ctx, nil)
	if err != nil || len(dead) != 1 || dead[0].ID != id {
		t.Fatalf("ListDead by a reader an hour behind: %v, %v; want the dead letter", dead, err)
	}
	if old, err := store.ListDead(ctx, &outboxdriver.DeadFilter{OlderThan: time.Minute}); err != nil || len(old) != 0 {
		t.Fatalf("dead for at least a minute: %v, %v; want none", old, err)
	}
	if n, err := store.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: []string{id}}); err != nil || n != 1 {
		t.Fatalf("ReplayDead: %d, %v; want 1", n, err)
	}
}
