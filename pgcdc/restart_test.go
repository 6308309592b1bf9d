package pgcdc_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

// TestPostgresRestart restarts (cleanly, then as a crash) a PostgreSQL server of the
// test's own while producers write and a CDC relay streams: nothing committed is lost,
// order per aggregate holds, and the relay resumes by itself.
func TestPostgresRestart(t *testing.T) {
	t.Parallel()
	c, pool := cluster(t)
	ctx := context.Background()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			table := outboxdriver.Table{Schema: "restart_" + string(mode[0]), Write: mode}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			src, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: quiet(), StatusInterval: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := src.Init(ctx); err != nil {
				t.Fatal(err)
			}
			b := memory.New(0)
			r, err := relay.New(src, b, &relay.Config{Logger: quiet(), BackoffMin: 20 * time.Millisecond, BackoffMax: 300 * time.Millisecond, LeaderRetry: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				_ = r.Stop(sctx)
			}()

			const aggs, per = 4, 150
			w, _ := outbox.NewWriter(drv, nil)
			var wg sync.WaitGroup
			for a := range aggs {
				wg.Add(1)
				go func(agg string) {
					defer wg.Done()
					for i := 0; i < per; {
						ev := outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Step", Payload: []byte(`{"i":` + strconv.Itoa(i) + `}`)}
						wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error { return w.WriteTx(wctx, tx, ev) })
						cancel()
						if err != nil {
							// The server is down. A commit whose answer was lost may
							// have happened: writing i again is then a repeat.
							time.Sleep(50 * time.Millisecond) //nolint:forbidigo // a producer's pause while the server restarts, not a wait for a state
							continue
						}
						i++
						time.Sleep(2 * time.Millisecond) //nolint:forbidigo // paces the producers, so that the restarts fall amid their writes
					}
				}("agg-" + strconv.Itoa(a))
			}
			waitMessages(t, b, 50) // the restarts fall amid the writes
			t0 := time.Now()
			c.Stop(t, "fast")
			c.Start(t)
			t.Logf("clean restart took %v", time.Since(t0).Round(time.Millisecond))
			waitMessages(t, b, min(len(b.Messages())+50, aggs*per))
			t0 = time.Now()
			c.Stop(t, "immediate") // a crash: the slot's saved position may be older
			c.Start(t)
			// Connections the pool holds from before the crash are dead; one idle for
			// less than pgxpool's ping threshold would be handed out as it is, and the
			// next subtest's first statement would fail with it.
			pool.Reset()
			t.Logf("crash restart took %v", time.Since(t0).Round(time.Millisecond))
			wg.Wait()
			waitMessages(t, b, aggs*per)
			// Repeats are allowed (after the crash, and the lost commit answers), gaps
			// and reordering are not.
			dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer dcancel()
			testenv.Wait(t, dctx, "every event delivered", func() bool { return delivered(b, aggs, per) })
			dups := checkDelivery(t, b.Messages(), aggs, per)
			t.Logf("%s: %d messages for %d events (%d repeats)", mode, len(b.Messages()), aggs*per, dups)
		})
	}
}

// TestInvalidatedSlot: PostgreSQL invalidates a slot that falls behind
// max_slot_wal_keep_size (failure class 6). The relay stops with ErrSlotLost (never
// streams on as if nothing happened); --recreate-slot republishes the rows still in the
// table, the ones written while the slot was behind included.
func TestInvalidatedSlot(t *testing.T) {
	t.Parallel()
	_, pool := cluster(t)
	ctx := context.Background()
	table := outboxdriver.Table{Schema: "lost"}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	src, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Init(ctx); err != nil {
		t.Fatal(err)
	}
	w, _ := outbox.NewWriter(drv, nil)
	var ids []string
	for i := 0; i < 10; i++ {
		evs := []outbox.Event{{AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{"i":` + strconv.Itoa(i) + `}`)}}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, evs[0].ID)
	}
	// No relay runs: the slot falls behind until PostgreSQL gives up on it.
	for _, q := range []string{`ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`, `CREATE TABLE lost.filler (v text)`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var status string
		if err := pool.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, src.Slot()).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot was not invalidated (wal_status %q)", status)
		}
		for _, q := range []string{`INSERT INTO lost.filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)`, `SELECT pg_switch_wal()`, `CHECKPOINT`} {
			if _, err := pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := memory.New(0)
	r, err := relay.New(src, b, &relay.Config{Logger: quiet(), BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = r.Run(rctx)
	if !errors.Is(err, pgcdc.ErrSlotLost) || !errors.Is(err, outboxdriver.ErrNeedsOperator) {
		t.Fatalf("relay on an invalidated slot: %v, want ErrSlotLost", err)
	}
	admin, _ := drv.Store()
	st, err := admin.Status(ctx)
	if err != nil || len(st.Slots) != 1 || st.Slots[0].WALStatus != "lost" {
		t.Fatalf("status of a lost slot: %+v, %v", st, err)
	}

	recovered, err := pgcdc.ForDriver(drv, &pgcdc.Config{Logger: quiet(), RecreateSlot: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := relay.New(recovered, b, &relay.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = r2.Stop(sctx)
	}()
	msgs := waitMessages(t, b, len(ids))
	for i, id := range ids {
		if msgs[i].ID != id {
			t.Fatalf("recovered event %d is %s, want %s (in order)", i, msgs[i].ID, id)
		}
	}
}

// cluster starts a PostgreSQL server of the test's own and returns a pool on it.
func cluster(t *testing.T) (*testenv.Cluster, *pgxpool.Pool) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PostgreSQL server")
	}
	c := testenv.NewCluster(t)
	pool, err := pgxpool.New(context.Background(), c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return c, pool
}

// delivered reports whether every aggregate's last event arrived.
func delivered(b *memory.Broker, aggs, per int) bool {
	seen := map[string]bool{}
	for _, m := range b.Messages() {
		var i int
		if _, err := fmt.Sscanf(string(m.Payload), `{"i":%d}`, &i); err == nil && i == per-1 {
			seen[m.AggregateID] = true
		}
	}
	return len(seen) == aggs
}
