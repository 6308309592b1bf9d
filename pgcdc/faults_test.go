package pgcdc_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/outboxdriver/pgmessage"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

// Rows committed before the slot exists (and while it is being created) are published
// by the backfill; nothing falls in the gap (failure class 7).
func TestStartDuringBurstBackfillsRowsBeforeTheSlot(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteRows)
	var wrote sync.WaitGroup
	wrote.Add(1)
	go func() { defer wrote.Done(); e.produce(t, 4, 150) }()
	e.waitRows(t, 20) // the burst is under way: some rows predate the slot
	src, err := pgcdc.ForDriver(e.drv, &pgcdc.Config{Logger: quiet(), StatusInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b := memory.New(0)
	e.startRelay(t, src, b, nil)
	wrote.Wait()
	waitMessages(t, b, 4*150)
	checkDelivery(t, b.Messages(), 4, 150)
}

// A standby relay waits on the table lock and takes over when the active one stops;
// order holds across the handover.
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteMessage)
	b := memory.New(0)
	active := e.startRelay(t, e.source(t, nil), b, nil)
	e.startRelay(t, e.source(t, nil), b, nil)
	var wrote sync.WaitGroup
	wrote.Add(1)
	go func() { defer wrote.Done(); e.produce(t, 4, 150) }()
	waitMessages(t, b, 20) // the active relay is under way
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := active.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	wrote.Wait()
	waitMessages(t, b, 4*150)
	checkDelivery(t, b.Messages(), 4, 150)
}

// While the outbox is quiet and the rest of the database busy, keepalives still move
// the slot forward: it does not pin WAL (failure class 8).
func TestIdleSlotAdvances(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteRows)
	b := memory.New(0)
	e.startRelay(t, e.source(t, nil), b, nil)
	ctx := context.Background()
	other := pgx.Identifier{e.table.Schema, "busy"}.Sanitize()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+other+` (v text)`); err != nil {
		t.Fatal(err)
	}
	// behind is how far the slot's confirmed position is behind lsn (negative: past it).
	behind := func(lsn string) int64 {
		var n int64
		if err := e.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($2::pg_lsn, confirmed_flush_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = $1`, e.slot, lsn).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i := 0; i < 20; i++ {
		if _, err := e.pool.Exec(ctx, `INSERT INTO `+other+` SELECT repeat('x', 1000) FROM generate_series(1, 1000)`); err != nil {
			t.Fatal(err)
		}
	}
	// The end of the busy writes: the slot must come past it. (Not its lag then: a
	// relay quick to confirm may already be past most of them.)
	var written string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&written); err != nil {
		t.Fatal(err)
	}
	testenv.WaitTell(t, ctx, "the slot to move past the busy writes", func() bool {
		// Any WAL activity makes the server send its position.
		if _, err := e.pool.Exec(ctx, `INSERT INTO `+other+` VALUES ('tick')`); err != nil {
			t.Fatal(err)
		}
		return behind(written) <= 0
	}, func() string {
		return fmt.Sprintf("slot still %d bytes behind the end of the busy writes", behind(written))
	})
}

// A refused event is retried, then dead-lettered holding its aggregate; the
// aggregate's later events wait in the dead letters too; other aggregates flow; a
// replay of the aggregate publishes them all in order.
func TestDeadLettersAndReplay(t *testing.T) {
	t.Parallel()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			e := setup(t, mode)
			b := memory.New(0)
			b.Refuse("agg-0", true)
			src := e.source(t, nil)
			e.startRelay(t, src, b, &relay.Config{MaxAttempts: 2, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
			produced := e.produce(t, 3, 20)
			msgs := waitMessages(t, b, 2*20)
			for _, m := range msgs {
				if m.AggregateID == "agg-0" {
					t.Fatalf("a refused aggregate's event was published: %+v", m)
				}
			}
			waitHeldDead(t, e, "agg-0", 20)
			b.RefuseNone("agg-0")
			if n, err := e.admin(t).ReplayDead(context.Background(), &outboxdriver.DeadFilter{AggregateID: "agg-0"}); err != nil || n != 20 {
				t.Fatalf("replay: %d, %v", n, err)
			}
			waitDelivered(t, e, b, produced)
			checkDelivery(t, b.Messages(), 3, 20)
		})
	}
}

// Rows written before the slot, behind an event the broker refuses: the backfill
// dead-letters that event and then the rows it holds back, waiting behind it (left
// in the table they would wait for ever: after the backfill only the stream is
// read, and the replayed dead letter comes back through the stream alone); a replay
// of the aggregate publishes them all, in order, and later events flow as ever.
func TestBackfillDeadLettersWhatItHolds(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteRows)
	produced := e.produce(t, 3, 20) // before the slot: the backfill's
	b := memory.New(0)
	b.Refuse("agg-0", true)
	e.startRelay(t, e.source(t, nil), b, &relay.Config{MaxAttempts: 2, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	waitMessages(t, b, 2*20)
	waitHeldDead(t, e, "agg-0", 20)
	b.RefuseNone("agg-0")
	if n, err := e.admin(t).ReplayDead(context.Background(), &outboxdriver.DeadFilter{AggregateID: "agg-0"}); err != nil || n != 20 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	for agg, ids := range e.produceFrom(t, 3, 20, 5) { // after the slot: the stream's
		produced[agg] = append(produced[agg], ids...)
	}
	waitDelivered(t, e, b, produced)
	checkDelivery(t, b.Messages(), 3, 25)
}

// waitHeldDead waits until n events of agg are dead letters: the first holding the
// aggregate, the rest waiting behind it.
func waitHeldDead(t *testing.T, e *cdcEnv, agg string, n int) {
	t.Helper()
	ctx := context.Background()
	var dead []outboxdriver.DeadLetter
	testenv.WaitTell(t, ctx, fmt.Sprintf("%s's %d events in the dead letters", agg, n), func() bool {
		var err error
		if dead, err = e.admin(t).ListDead(ctx, &outboxdriver.DeadFilter{AggregateID: agg}); err != nil {
			t.Fatal(err)
		}
		return len(dead) == n
	}, func() string { return fmt.Sprintf("%d of %d", len(dead), n) })
	if !dead[0].HoldsKey || !strings.Contains(dead[1].Error, "waiting behind a dead letter") {
		t.Fatalf("dead letters: %+v / %+v", dead[0], dead[1])
	}
}

// A delayed event waits for its time; a non-transactional logical message (which
// PostgreSQL sends even when its transaction rolls back) goes to the dead letters.
func TestDelayedAndNonTransactional(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteMessage)
	b := memory.New(0)
	src := e.source(t, nil)
	e.startRelay(t, src, b, nil)
	ctx := context.Background()
	w, _ := outbox.NewWriter(e.drv, nil)
	at := time.Now().Add(700 * time.Millisecond)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return w.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "late", Type: "Reminder", Payload: []byte(`{}`), NotBefore: at})
	})
	if err != nil {
		t.Fatal(err)
	}
	content, _ := pgmessage.Encode(&outboxdriver.InsertEvent{ID: "0190d2a4-5b6c-7d8e-9f00-112233445566", AggregateType: "order", AggregateID: "nt", Type: "T", Payload: []byte(`{}`)})
	if _, err := e.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, $1, $2::bytea)`, e.table.MessagePrefix, content); err != nil {
		t.Fatal(err)
	}
	msgs := waitMessages(t, b, 1)
	if got := time.Now(); got.Before(at) || msgs[0].AggregateID != "late" {
		t.Fatalf("delayed event published %v early: %+v", at.Sub(got), msgs[0])
	}
	var dead []outboxdriver.DeadLetter
	testenv.WaitTell(t, ctx, "the non-transactional message's dead letter", func() bool {
		var err error
		if dead, err = e.admin(t).ListDead(ctx, &outboxdriver.DeadFilter{}); err != nil {
			t.Fatal(err)
		}
		return len(dead) == 1 && strings.Contains(dead[0].Error, "transactional = false")
	}, func() string { return fmt.Sprintf("dead letters: %+v", dead) })
	if n := len(b.Messages()); n != 1 {
		t.Fatalf("%d messages published, want only the delayed one", n)
	}
}

// One transaction of 100,000 events streams through with bounded memory: the relay
// holds at most MaxPending of them at a time.
func TestLargeTransactionBoundedMemory(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("100,000 events")
	}
	e := setup(t, outboxdriver.WriteMessage)
	url := natstest.URL(t)
	ctx := context.Background()
	stream := testenv.UniqueName("cdcbig")
	js, s := natstest.CreateStream(t, url, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, Storage: jetstream.MemoryStorage})
	pub, err := natspub.New(js, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	src := e.source(t, &pgcdc.Config{MaxPending: 2000}) // the slot exists before the write
	const n, size = 100_000, 1000
	pad := strings.Repeat("x", size)
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{AggregateType: "big", AggregateID: fmt.Sprint(i % 100), Type: "T", Payload: []byte(`{"p":"` + pad + `"}`)}
	}
	// A connection of its own: pgx keeps a connection's (here 100 MB) write buffer,
	// which is the producer's memory, not the relay's.
	conn, err := pgx.Connect(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := outbox.NewWriter(outboxpgx.New(nil, &e.table), nil)
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	evs = nil

	var peak atomic.Uint64
	stop := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			runtime.GC() // the live heap: what the relay holds, not garbage awaiting collection
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
		}
	}()
	start := time.Now()
	e.startRelay(t, src, pub, &relay.Config{TopicTemplate: stream + ".${aggregatetype}"})
	wctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	var msgs uint64
	testenv.WaitTell(t, wctx, "every event in the stream", func() bool {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msgs = info.State.Msgs
		return msgs >= n
	}, func() string { return fmt.Sprintf("%d of %d events published", msgs, n) })
	close(stop)
	sampled.Wait()
	live := peak.Load()
	t.Logf("100,000 events (%d MB) in one transaction in %v; live heap at most %d MiB", n*size/1_000_000, time.Since(start).Round(time.Millisecond), live>>20)
	if live > 48<<20 {
		t.Fatalf("live heap reached %d MiB for a %d MB transaction: memory is not bounded", live>>20, n*size>>20)
	}
}

// waitDelivered waits until every produced event is on the broker; on timeout it
// says where each missing one is (waiting, dead, gone).
func waitDelivered(t *testing.T, e *cdcEnv, b *memory.Broker, produced map[string][]string) {
	t.Helper()
	want := 0
	for _, ids := range produced {
		want += len(ids)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testenv.WaitTell(t, ctx, fmt.Sprintf("%d messages on the broker", want), func() bool { return len(b.Messages()) >= want }, func() string {
		got := map[string]bool{}
		for _, m := range b.Messages() {
			got[m.ID] = true
		}
		var out strings.Builder
		for agg, ids := range produced {
			for i, id := range ids {
				if got[id] {
					continue
				}
				ev, err := e.admin(t).Event(context.Background(), id)
				if err != nil {
					fmt.Fprintf(&out, "missing %s #%d %s: %v\n", agg, i, id, err)
					continue
				}
				fmt.Fprintf(&out, "missing %s #%d %s: %s attempts %d error %q dead %v holds %v\n", agg, i, id, ev.State, ev.Attempts, ev.Error, ev.DeadAt, ev.HoldsKey)
			}
		}
		fmt.Fprintf(&out, "only %d of %d messages arrived", len(b.Messages()), want)
		return out.String()
	})
}

// A relay stopped cleanly confirms everything it published: the next one, on the same
// slot, publishes nothing again (a crash may repeat the batch in flight; a stop may
// not). Each round writes one event, relays it, stops the relay, and checks the next
// relay's first message is the next event.
func TestCleanStopRepublishesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteRows)
	ctx := context.Background()
	w, err := outbox.NewWriter(e.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 15 {
		id := fmt.Sprintf("0190d2a4-5b6c-7d8e-9f00-%012d", round)
		if err := w.Write(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		b := memory.New(0)
		r := e.startRelay(t, e.source(t, nil), b, nil)
		msgs := waitMessages(t, b, 1)
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if got := b.Messages(); len(got) != 1 || msgs[0].ID != id {
			ids := make([]string, len(got))
			for i, m := range got {
				ids[i] = m.ID
			}
			t.Fatalf("round %d: the relay published %v, want only %s", round, ids, id)
		}
	}
}

// A slot that sends again events an earlier relay published and marked (its position
// trailed the marks: the relay was killed before it reported it, or PostgreSQL
// crashed before it saved the slot) has them skipped, not sent twice. A second slot,
// made before the writes, stands for that trailing position. Events written once the
// relay on it started go out.
func TestResentMarkedRowsSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteRows)
	trailing := e.slot + "_trailing"
	t.Cleanup(func() { dropSlot(t, e.pool, trailing) })
	behind := e.source(t, &pgcdc.Config{Slot: trailing})
	first := memory.New(0)
	r := e.startRelay(t, e.source(t, nil), first, nil)
	published := e.produce(t, 3, 20)
	waitDelivered(t, e, first, published)
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	b := memory.New(0)
	e.startRelay(t, behind, b, nil)
	later := e.produceFrom(t, 3, 20, 5)
	waitDelivered(t, e, b, later)
	for _, m := range b.Messages() {
		for _, ids := range published {
			if slices.Contains(ids, m.ID) {
				t.Fatalf("event %s, published and marked by the first relay, went out again", m.ID)
			}
		}
	}
}
