package outboxpgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	url := testenv.DatabaseURL(t)
	outboxdrivertest.Run(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[pgx.Tx] {
		pool := testenv.Pool(t, url)
		table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outbox", Payload: payload}
		return &outboxdrivertest.Harness[pgx.Tx]{
			Driver:   outboxpgx.New(pool, &table),
			Begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
			Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
			Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
			InsertPlain: func(ctx context.Context, id, at, aid, typ, payload string) error {
				_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table.Schema, table.Name}.Sanitize()+
					" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)", id, at, aid, typ, payload)
				return err
			},
			MultipleClaims:    true,
			ConcurrentWriters: true,
		}
	})
}
