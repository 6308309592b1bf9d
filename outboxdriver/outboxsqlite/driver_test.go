package outboxsqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[*sql.Tx] {
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
