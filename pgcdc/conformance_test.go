package pgcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
	t.Parallel()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteInsertDelete, outboxdriver.WriteMessage} {
		for _, shared := range []bool{false, true} {
			name := string(mode)
			if shared {
				name += "/shared"
			}
			t.Run(name, func(t *testing.T) { conformance(t, mode, shared) })
		}
	}
}

// conformance runs the suite on a table of its own slot, or (shared) on a table of
// a Shared stream.
func conformance(t *testing.T, mode outboxdriver.WriteMode, shared bool) {
	t.Helper()
	url := testenv.DatabaseURL(t)
	outboxdrivertest.RunSource(t, func(t *testing.T, payload outboxdriver.PayloadType) *outboxdrivertest.Harness[pgx.Tx] {
		t.Helper()
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
				t.Helper()
				if shared {
					return sharedSource(t, pool, drv, table)
				}
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
}

// sharedSource is table's Source on a Shared stream of its own, streaming from the
// moment it returns until the test ends.
func sharedSource(t *testing.T, pool *pgxpool.Pool, drv *outboxpgx.Driver, table outboxdriver.Table) outboxdriver.Source {
	t.Helper()
	slot := "outbox_" + table.WithDefaults().Schema + "_shared"
	t.Cleanup(func() { dropSlot(t, pool, slot) })
	sh, err := pgcdc.NewShared(pool, &pgcdc.SharedConfig{Slot: slot, Logger: testenv.QuietLogger(), StatusInterval: 100 * time.Millisecond, Retry: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	src, err := sh.Add(context.Background(), inner, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testenv.WaitTell(t, ctx, "the shared slot streaming", sh.Streaming, func() string { return "not streaming" })
	return src
}
