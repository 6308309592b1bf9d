package pgcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxdrivertest"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
)

// TestConformance runs the cases of the relay's seam (outboxdrivertest.RunSource) on
// the CDC source, in each write mode: what the relay relies on holds whether it claims
// from the table or from the WAL.
func TestConformance(t *testing.T) {
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteInsertDelete, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			url := testenv.DatabaseURL(t)
			outboxdrivertest.RunSource(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[pgx.Tx] {
				pool := testenv.Pool(t, url)
				testenv.LogicalReplication(t, pool)
				table := outboxdriver.Table{Schema: testenv.Schema(t, url), Name: "outbox", Payload: payload, Write: mode}
				drv := outboxpgx.New(pool, &table)
				return &outboxdrivertest.Harness[pgx.Tx]{
					Driver:   drv,
					Begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
					Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
					Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
					Source: func(t *testing.T) outboxdriver.Source {
						src, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: testenv.QuietLogger(), StatusInterval: 100 * time.Millisecond})
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { dropSlot(t, pool, pgcdc.DefaultSlot(table)) })
						if err := src.Init(context.Background()); err != nil {
							t.Fatal(err)
						}
						return src
					},
					MultipleClaims:    true,
					ConcurrentWriters: true,
				}
			})
		})
	}
}
