package outboxsql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxsql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	url := testenv.DatabaseURL(t)
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[*sql.Tx] {
		t.Helper()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outbox", Payload: payload}
		return &outboxdrivertest.Harness[*sql.Tx]{
			Driver:   outboxsql.New(db, &table),
			Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
			Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
			AddColumn: func(ctx context.Context, name, typ string) error {
				_, err := db.ExecContext(ctx, "ALTER TABLE "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+" ADD COLUMN "+name+" "+typ)
				return err
			},
			InsertPlain: func(ctx context.Context, id, at, aid, typ, payload string) error {
				_, err := db.ExecContext(ctx, "INSERT INTO "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+
					" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)", id, at, aid, typ, payload)
				return err
			},
			Reopen:            func(t outboxdriver.Table) outboxdriver.Driver[*sql.Tx] { return outboxsql.New(db, &t) },
			HoldRow:           testenv.HoldRow(db, pgx.Identifier{table.Schema, table.Name}.Sanitize(), "FOR SHARE", "$1::uuid"),
			MultipleClaims:    true,
			ConcurrentWriters: true,
		}
	})
}
