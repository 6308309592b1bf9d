package pgcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

// TestPartitionedCDCRelay (issue #20): the active CDC relay's connections (its table
// lock session and its replication stream) are blackholed while producers write.
// PostgreSQL ends both within LeaderTimeout (idle_session_timeout and
// wal_sender_timeout), the standby streams from the slot, and after healing nothing
// is lost and no first delivery is out of order.
func TestPartitionedCDCRelay(t *testing.T) {
	t.Parallel()
	const bound = 3 * time.Second
	e := setup(t, outboxdriver.WriteRows)
	poolA, proxy := testenv.ProxiedPool(t, e.url)
	srcA, err := pgcdc.ForDriver(outboxpgx.New(poolA, &e.table), &pgcdc.Config{Logger: quiet(), StatusInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := srcA.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	mem := memory.New(0)
	pubA, pubB := &testenv.Counted{Publisher: mem}, &testenv.Counted{Publisher: mem}
	a := e.startRelay(t, srcA, pubA, &relay.Config{LeaderTimeout: bound})
	ctx := context.Background()
	testenv.Wait(t, ctx, "the first relay to lead", func() bool { return a.Stats().Leader })
	e.startRelay(t, e.source(t, nil), pubB, &relay.Config{LeaderTimeout: bound})

	const aggs, per = 6, 150
	done := make(chan struct{})
	go func() { defer close(done); e.produce(t, aggs, per) }()
	testenv.Wait(t, ctx, "the leader streaming", func() bool { return pubA.N.Load() > 0 })
	proxy.Blackhole()
	cut := time.Now()
	testenv.Wait(t, ctx, "the standby streaming after the CDC leader was cut off", func() bool { return pubB.N.Load() > 0 })
	// Measured, not asserted: the bound is the database's (wal_sender_timeout).
	t.Logf("standby streaming %v after the cut (LeaderTimeout %v)", time.Since(cut).Round(time.Millisecond), bound)
	proxy.Heal()
	<-done
	dups := checkDelivery(t, waitMessages(t, mem, aggs*per), aggs, per)
	t.Logf("%d repeats dropped by the broker, %d re-sent to it", mem.Duplicates(), dups)
}
