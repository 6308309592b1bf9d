package pgcdc_test

import (
	"context"
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
	if testing.Short() {
		t.Skip("starts a PostgreSQL server")
	}
	c := testenv.NewCluster(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			table := outboxdriver.Table{Schema: "restart_" + string(mode[0]), Write: mode}
			drv := outboxpgx.New(pool, &table)
			m, _ := drv.Migrator()
			if _, err := m.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			src, err := drv.CDC(&pgcdc.Config{Logger: quiet(), StatusInterval: 100 * time.Millisecond})
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
							time.Sleep(50 * time.Millisecond)
							continue
						}
						i++
						time.Sleep(2 * time.Millisecond)
					}
				}("agg-" + strconv.Itoa(a))
			}
			time.Sleep(150 * time.Millisecond)
			t0 := time.Now()
			c.Stop(t, "fast")
			c.Start(t)
			t.Logf("clean restart took %v", time.Since(t0).Round(time.Millisecond))
			time.Sleep(150 * time.Millisecond)
			t0 = time.Now()
			c.Stop(t, "immediate") // a crash: the slot's saved position may be older
			c.Start(t)
			t.Logf("crash restart took %v", time.Since(t0).Round(time.Millisecond))
			wg.Wait()
			waitMessages(t, b, aggs*per)
			// Repeats are allowed (after the crash, and the lost commit answers), gaps
			// and reordering are not.
			deadline := time.Now().Add(30 * time.Second)
			for {
				if ok := delivered(b, aggs, per); ok || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			dups := checkDelivery(t, b.Messages(), aggs, per)
			t.Logf("%s: %d messages for %d events (%d repeats)", mode, len(b.Messages()), aggs*per, dups)
		})
	}
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
