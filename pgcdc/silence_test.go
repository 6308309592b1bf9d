package pgcdc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
)

// TestStreamNoticesASilentServer: the replication connection alone is black-holed
// (no reset, no error: the packets go nowhere). The stream asks the server for an
// answer each quiet status period and, hearing none within its silence bound, ends
// with ErrServerSilent instead of waiting for ever, while every other connection
// (the lock session's) may still answer.
func TestStreamNoticesASilentServer(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	testenv.LogicalReplication(t, pool)
	ctx := context.Background()
	name := testenv.UniqueName("outbox_silence_")
	if _, err := pool.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP PUBLICATION IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	proxied, proxy := testenv.ProxiedPool(t, url)
	conn, err := connectReplication(ctx, proxied, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	slot, err := pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Temporary: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := startReplication(ctx, conn, name, name); err != nil {
		t.Fatal(err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(10, 0, 0)
	l.reached = uint64(start)
	s := &stream{conn: conn, dec: NewDecoder(outboxdriver.Table{Schema: "public", Name: name}, ""), l: l,
		route: func(*Change) (*queue, error) { return nil, nil }, statusEvery: 100 * time.Millisecond, silence: 2 * time.Second,
		log: testenv.QuietLogger(), bad: func(uint64, error) {}}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ended := make(chan error, 1)
	go func() { ended <- s.run(runCtx) }()
	proxy.Blackhole()
	select {
	case err := <-ended:
		if !errors.Is(err, ErrServerSilent) {
			t.Fatalf("the stream ended with %v, want ErrServerSilent", err)
		}
		t.Log(err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the stream still waits on a black-holed connection")
	}
	proxy.Heal()
}
