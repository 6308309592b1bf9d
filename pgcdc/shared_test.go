package pgcdc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
)

// sharedEnv is a Shared stream over test tables, running until the test ends.
type sharedEnv struct {
	sh   *pgcdc.Shared
	slot string
	stop func()
}

// sharedSlot names a test's shared slot after its first table's schema, so that
// .ci/run's clean-up of left-over test slots finds it, and drops it when the test ends.
func sharedSlot(t *testing.T, e *cdcEnv) string {
	t.Helper()
	slot := "outbox_" + e.table.Schema + "_shared"
	t.Cleanup(func() { dropSlot(t, e.pool, slot) })
	return slot
}

func startShared(t *testing.T, pool *pgxpool.Pool, cfg pgcdc.SharedConfig, add func(sh *pgcdc.Shared)) *sharedEnv {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 100 * time.Millisecond
	}
	cfg.Retry = 100 * time.Millisecond
	sh, err := pgcdc.NewShared(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if add != nil {
		add(sh)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx) }()
	var once sync.Once
	se := &sharedEnv{sh: sh, slot: sh.Slot(), stop: func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}}
	t.Cleanup(se.stop)
	return se
}

func (se *sharedEnv) add(t *testing.T, e *cdcEnv) *pgcdc.Source {
	t.Helper()
	s, err := se.sh.Add(context.Background(), e.admin(t), e.table)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func publicationTables(t *testing.T, pool *pgxpool.Pool, pub string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, pub)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// holdLock holds table e's relay lock, as another relay would, until release (or
// the test's end): its relays here stand by.
func holdLock(t *testing.T, e *cdcEnv) (release func()) {
	t.Helper()
	lock, err := e.admin(t).AcquireLeadership(context.Background(), nil)
	if err != nil || lock == nil {
		t.Fatalf("holding %s's relay lock: %v, %v", e.table, lock, err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := lock.Release(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// TestSharedSlot: one slot and one publication carry several tables, each relayed
// by its own relay in order with nothing lost, over one replication connection: rows
// written before a table joined are published (its backfill), a table-less table's
// messages are routed by prefix, a table added while the stream runs joins the
// publication, a table removed leaves it and holds the confirmed position back no
// more, and a clean restart sends nothing twice.
func TestSharedSlot(t *testing.T) {
	t.Parallel()
	a, b := setup(t, outboxdriver.WriteRows), setup(t, outboxdriver.WriteMessage)
	ctx := context.Background()
	const aggs, per = 4, 30
	// Rows written before the slot: published by a's backfill.
	before := a.produce(t, aggs, 10)

	slot := sharedSlot(t, a)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	srcA, srcB := se.add(t, a), se.add(t, b)
	ba, bb := memory.New(0), memory.New(0)
	ra, rb := a.startRelay(t, srcA, ba, nil), b.startRelay(t, srcB, bb, nil)

	// b is table-less: its events exist only in the WAL, so it must stream before
	// they are written.
	testenv.WaitTell(t, ctx, "both relays leading", func() bool { return ra.Stats().Leader && rb.Stats().Leader },
		func() string { return fmt.Sprintf("a: %+v, b: %+v", ra.Stats(), rb.Stats()) })
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.produceFrom(t, aggs, 10, per-10) }()
	go func() { defer wg.Done(); b.produce(t, aggs, per) }()
	wg.Wait()
	checkDelivery(t, waitMessages(t, ba, aggs*per), aggs, per)
	checkDelivery(t, waitMessages(t, bb, aggs*per), aggs, per)
	if len(before["agg-0"]) != 10 {
		t.Fatalf("wrote %d events before the slot", len(before["agg-0"]))
	}
	if got, want := publicationTables(t, a.pool, slot), sorted(a.table.String(), b.table.String()); !slices.Equal(got, want) {
		t.Fatalf("publication lists %v, want %v", got, want)
	}
	var slots, walsenders int
	if err := a.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE slot_name = $1 AND active), count(*) FILTER (WHERE slot_name IN ($2, $3))
FROM pg_replication_slots`, slot, pgcdc.DefaultSlot(a.table), pgcdc.DefaultSlot(b.table)).Scan(&slots, &walsenders); err != nil {
		t.Fatal(err)
	}
	if slots != 1 || walsenders != 0 {
		t.Fatalf("shared slot active: %d; slots of the tables alone: %d", slots, walsenders)
	}

	// A table created while the stream runs, with rows written before it joins.
	c := setup(t, outboxdriver.WriteRows)
	c.produce(t, aggs, 10)
	bc := memory.New(0)
	c.startRelay(t, se.add(t, c), bc, nil)
	c.produceFrom(t, aggs, 10, per-10)
	checkDelivery(t, waitMessages(t, bc, aggs*per), aggs, per)

	// b leaves: its relay stops, the table leaves the publication, and its events
	// written since no longer hold the slot's position back.
	if err := rb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := se.sh.Remove(ctx, b.table); err != nil {
		t.Fatal(err)
	}
	if got, want := publicationTables(t, a.pool, slot), sorted(a.table.String(), c.table.String()); !slices.Equal(got, want) {
		t.Fatalf("after removing %s the publication lists %v, want %v", b.table, got, want)
	}
	wb, err := outbox.NewWriter(b.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := wb.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "gone", Type: "T", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := a.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	testenv.WaitTell(t, ctx, "the slot confirmed past the removed table's event", func() bool {
		var past bool
		err := a.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot, after).Scan(&past)
		return err == nil && past
	}, func() string { return "confirmed_flush_lsn stays behind " + after })

	// A clean stop and a new process: nothing is sent twice, and what is written
	// meanwhile arrives.
	if err := ra.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	se.stop()
	wa, err := outbox.NewWriter(a.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := outbox.Event{ID: "0190d2a4-5b6c-7d8e-9f00-000000000030", AggregateType: "order", AggregateID: "agg-0", Type: "Step", Payload: []byte(`{}`)}
	if err := wa.Write(ctx, last); err != nil {
		t.Fatal(err)
	}
	se2 := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	ba2 := memory.New(0)
	r := a.startRelay(t, se2.add(t, a), ba2, nil)
	se2.add(t, c)
	waitMessages(t, ba2, 1)
	if msgs := a.settled(t, r, ba2); len(msgs) != 1 || msgs[0].ID != last.ID {
		t.Fatalf("after a clean restart the relay sent %d events (%s...), want only %s", len(msgs), msgs[0].ID, last.ID)
	}
}

// TestSharedSlotFindsNewTables: an event of a table-less table that matches but was
// not added yet (a tenant created and written to between two rescans) is not
// confirmed past, though it exists nowhere but in the WAL: the stream asks for a
// rescan first, the table is added, and its events arrive. A new rows-mode table is
// not in the publication until a rescan adds it; then its rows written before
// arrive, by its backfill.
func TestSharedSlotFindsNewTables(t *testing.T) {
	t.Parallel()
	a := setup(t, outboxdriver.WriteRows)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	var mu sync.Mutex
	candidates := map[string]*cdcEnv{} // the tables a rescan would find
	brokers := map[string]*memory.Broker{}
	var se *sharedEnv
	cfg := pgcdc.SharedConfig{Slot: slot,
		Match: func(tb outboxdriver.Table) bool {
			return strings.HasPrefix(tb.Schema, "outbox_test_") && tb.Name == "outbox"
		},
		Rescan: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			for name, e := range candidates {
				if _, ok := brokers[name]; ok {
					continue
				}
				src, err := se.sh.Add(ctx, e.admin(t), e.table)
				if err != nil {
					return err
				}
				brokers[name] = memory.New(0)
				e.startRelay(t, src, brokers[name], nil)
			}
			return nil
		}}
	se = startShared(t, a.pool, cfg, nil)
	ra := a.startRelay(t, se.add(t, a), memory.New(0), nil)
	testenv.WaitTell(t, ctx, "the relay leading", func() bool { return ra.Stats().Leader }, func() string { return "standby" })

	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteMessage, outboxdriver.WriteRows} {
		n := setup(t, mode)
		mu.Lock()
		candidates[n.table.String()] = n
		mu.Unlock()
		n.produce(t, 2, 5)
		if mode == outboxdriver.WriteRows {
			if err := cfg.Rescan(ctx); err != nil { // the owner's periodic rescan
				t.Fatal(err)
			}
		}
		var b *memory.Broker
		testenv.WaitTell(t, ctx, "the new table found", func() bool {
			mu.Lock()
			defer mu.Unlock()
			b = brokers[n.table.String()]
			return b != nil
		}, func() string { return "no rescan added " + n.table.String() })
		checkDelivery(t, waitMessages(t, b, 10), 2, 5)
	}
}

// TestSharedSlotBackfillDeadLetters: a table joins a running shared slot with rows
// written before, one aggregate's refused by the broker: its backfill dead-letters
// that aggregate's first event and the rows behind it, so a replay publishes them all
// in order through the stream, with the events written after.
func TestSharedSlotBackfillDeadLetters(t *testing.T) {
	t.Parallel()
	a := setup(t, outboxdriver.WriteRows)
	slot := sharedSlot(t, a)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	a.startRelay(t, se.add(t, a), memory.New(0), nil)

	n := setup(t, outboxdriver.WriteRows)
	produced := n.produce(t, 2, 10) // before the table joins: its backfill's
	b := memory.New(0)
	b.Refuse("agg-0", true)
	n.startRelay(t, se.add(t, n), b, &relay.Config{MaxAttempts: 2, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	waitMessages(t, b, 10)
	waitHeldDead(t, n, "agg-0", 10)
	b.RefuseNone("agg-0")
	if got, err := n.admin(t).ReplayDead(context.Background(), &outboxdriver.DeadFilter{AggregateID: "agg-0"}); err != nil || got != 10 {
		t.Fatalf("replay: %d, %v", got, err)
	}
	for agg, ids := range n.produceFrom(t, 2, 10, 5) {
		produced[agg] = append(produced[agg], ids...)
	}
	waitDelivered(t, n, b, produced)
	checkDelivery(t, b.Messages(), 2, 15)
}

// TestSharedSlotStandby: a second process cannot take the slot while the first
// streams; it stands by for every table, and takes over when the first stops.
func TestSharedSlotStandby(t *testing.T) {
	t.Parallel()
	a := setup(t, outboxdriver.WriteRows)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	se1 := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	b1 := memory.New(0)
	r1 := a.startRelay(t, se1.add(t, a), b1, nil)
	testenv.WaitTell(t, ctx, "the first leading", func() bool { return r1.Stats().Leader }, func() string { return "standby" })
	se2 := startShared(t, testenv.Pool(t, a.url), pgcdc.SharedConfig{Slot: slot, Logger: slog.Default()}, nil)
	b2 := memory.New(0)
	r2 := a.startRelay(t, se2.add(t, a), b2, &relay.Config{LeaderRetry: 100 * time.Millisecond})
	a.produce(t, 2, 10)
	waitMessages(t, b1, 20)
	if r2.Stats().Leader || len(b2.Messages()) != 0 {
		t.Fatalf("the standby leads (%v) or published %d events", r2.Stats().Leader, len(b2.Messages()))
	}
	if err := r1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	se1.stop()
	wa, err := outbox.NewWriter(a.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := wa.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "agg-0", Type: "Step", Payload: []byte(`{"i":10}`)}); err != nil {
		t.Fatal(err)
	}
	waitMessages(t, b2, 1)
	if msgs := a.settled(t, r2, b2); len(msgs) != 1 {
		t.Fatalf("the standby sent %d events after a clean hand-over, want 1", len(msgs))
	}
}

// TestSharedSlotStuckTable: a table whose relay cannot lead (here its lock is held
// elsewhere) holds the slot's confirmed position back, and with it the WAL, but
// not the other tables: they go on, and after the stream is read again from the
// held-back position (a restart) they skip what they had already sent, by their own
// recorded progress. Once the stuck table's relay leads, its events arrive.
func TestSharedSlotStuckTable(t *testing.T) {
	t.Parallel()
	a, b := setup(t, outboxdriver.WriteRows), setup(t, outboxdriver.WriteMessage)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	release := holdLock(t, b)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	ba, bb := memory.New(0), memory.New(0)
	ra := a.startRelay(t, se.add(t, a), ba, nil)
	a.startRelay(t, se.add(t, b), bb, &relay.Config{LeaderRetry: 100 * time.Millisecond})
	testenv.WaitTell(t, ctx, "a's relay leading", func() bool { return ra.Stats().Leader }, func() string { return "standby" })

	b.produce(t, 2, 5) // stuck behind b's lock
	a.produce(t, 3, 20)
	// A last event of a's, committed past end: a's progress reaches end once it
	// is done.
	var end string
	if err := a.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	wa, err := outbox.NewWriter(a.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := wa.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "last", Type: "Step", Payload: []byte(`{"i":0}`)}); err != nil {
		t.Fatal(err)
	}
	checkDelivery(t, waitMessages(t, ba, 61), 3, 20)
	cdc := `SELECT coalesce(done_lsn >= $2::pg_lsn, false) FROM ` + a.table.Schema + `.outbox_cdc WHERE slot = $1`
	testenv.WaitTell(t, ctx, "a's progress recorded past its events", func() bool {
		var past bool
		return a.pool.QueryRow(ctx, cdc, slot, end).Scan(&past) == nil && past
	}, func() string { return "done_lsn stays behind " + end })
	var held bool
	if err := a.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn < $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot, end).Scan(&held); err != nil || !held {
		t.Fatalf("the slot confirmed past b's unsent events: held %v, %v", held, err)
	}

	// A new process reads the stream again from before b's events, and a's.
	for _, r := range []*relay.Relay{ra} {
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	se.stop()
	se2 := startShared(t, testenv.Pool(t, a.url), pgcdc.SharedConfig{Slot: slot, Logger: slog.Default()}, nil)
	ba2, bb2 := memory.New(0), memory.New(0)
	ra2 := a.startRelay(t, se2.add(t, a), ba2, nil)
	srcB := se2.add(t, b)
	release()
	a.startRelay(t, srcB, bb2, nil)
	checkDelivery(t, waitMessages(t, bb2, 10), 2, 5)
	if n := len(a.settled(t, ra2, ba2)); n != 0 {
		t.Fatalf("a sent %d of its events again after the restart, want 0", n)
	}
	if n := len(bb.Messages()); n != 0 {
		t.Fatalf("b's relay published %d events without its lock", n)
	}
}

// TestSharedSlotWaitsForItsTables: a stream started before all its tables are added
// (a new process reading from the slot's position) does not read past the events of
// a table registered with the slot and not added yet, even table-less ones that
// exist nowhere else: it stops and tries again, and once the table is added they
// arrive. A table taken out (Remove) no longer holds the stream.
func TestSharedSlotWaitsForItsTables(t *testing.T) {
	t.Parallel()
	a, b := setup(t, outboxdriver.WriteRows), setup(t, outboxdriver.WriteMessage)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, func(sh *pgcdc.Shared) {
		for _, e := range []*cdcEnv{a, b} {
			if _, err := sh.Add(ctx, e.admin(t), e.table); err != nil {
				t.Fatal(err)
			}
		}
	})
	testenv.WaitTell(t, ctx, "streaming", se.sh.Streaming, func() string { return "not streaming" })
	se.stop()
	b.produce(t, 2, 5) // while no process streams
	a.produce(t, 2, 5)

	se2 := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	ba := memory.New(0)
	a.startRelay(t, se2.add(t, a), ba, nil)
	// b's events come first: nothing of a's passes them. The stream meets b's first
	// event, stops, and starts again, turn after turn.
	testenv.WaitTurns(t, ctx, "the shared stream", 2, se2.sh.Terms)
	if n := len(ba.Messages()); n != 0 {
		t.Fatalf("%d of a's events published past b's unread ones", n)
	}
	bb := memory.New(0)
	a.startRelay(t, se2.add(t, b), bb, nil)
	checkDelivery(t, waitMessages(t, bb, 10), 2, 5)
	checkDelivery(t, waitMessages(t, ba, 10), 2, 5)

	// Taken out, b's later events are skipped, not waited for.
	if err := se2.sh.Remove(ctx, b.table); err != nil {
		t.Fatal(err)
	}
	se2.stop()
	b.produce(t, 1, 3)
	a.produceFrom(t, 2, 5, 5)
	se3 := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	ba3 := memory.New(0)
	a.startRelay(t, se3.add(t, a), ba3, nil)
	msgs := waitMessages(t, ba3, 10)
	if first := string(msgs[0].Payload); !strings.Contains(first, "5") {
		t.Fatalf("after the restart a's first event is %s, want its 6th: the stream sent again what it had confirmed", first)
	}
}

// TestSharedSlotLost: a shared slot dropped after it streamed (a failover, an
// invalidation) stops the stream with ErrSlotLost, and RecreateSlot recovers: a new
// slot, and every table's unpublished rows published by its backfill.
func TestSharedSlotLost(t *testing.T) {
	t.Parallel()
	a := setup(t, outboxdriver.WriteRows)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot}, nil)
	b1 := memory.New(0)
	r := a.startRelay(t, se.add(t, a), b1, nil)
	a.produce(t, 2, 5)
	waitMessages(t, b1, 10)
	// A slot is known to have streamed once its table's backfill is recorded done;
	// one dropped before that is taken for new (its table backfills again, which
	// loses nothing) rather than lost. On a loaded machine the backfill can be
	// recorded after the first events arrive: wait for it.
	cdc := pgx.Identifier{a.table.Schema, a.table.Derived("_cdc")}.Sanitize()
	testenv.Wait(t, ctx, "the table's backfill recorded done", func() bool {
		var done bool
		return a.pool.QueryRow(ctx, `SELECT backfilled_at IS NOT NULL FROM `+cdc+` WHERE slot = $1`, slot).Scan(&done) == nil && done
	})
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	se.stop()
	if err := testenv.DropSlot(ctx, a.pool, slot); err != nil {
		t.Fatal(err)
	}
	a.produceFrom(t, 2, 5, 5) // unpublished when the slot is found gone

	sh, err := pgcdc.NewShared(a.pool, &pgcdc.SharedConfig{Slot: slot, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Add(ctx, a.admin(t), a.table); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := sh.Run(rctx); !errors.Is(err, pgcdc.ErrSlotLost) {
		t.Fatalf("a stream of a dropped slot: %v, want ErrSlotLost", err)
	}
	se2 := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot, RecreateSlot: true}, nil)
	b2 := memory.New(0)
	a.startRelay(t, se2.add(t, a), b2, nil)
	next := map[string]int{"agg-0": 5, "agg-1": 5} // the unpublished ones, in order
	for _, m := range waitMessages(t, b2, 10) {
		var i int
		if _, err := fmt.Sscanf(string(m.Payload), `{"i": %d}`, &i); err != nil || i != next[m.AggregateID] {
			t.Fatalf("after recreating the slot %s got %s, want i %d", m.AggregateID, m.Payload, next[m.AggregateID])
		}
		next[m.AggregateID]++
	}
}

// TestSharedSlotParksAStuckTable: tables that cannot get their events done (their
// relays cannot lead) fill the stream's room; after ParkAfter each is parked in turn,
// and the other table's events flow again. Once their relays lead and have caught
// up, the stream is read again from the slot's position: they get every event they
// missed, in order, and the other table sends nothing again.
func TestSharedSlotParksAStuckTable(t *testing.T) {
	t.Parallel()
	a, b, c := setup(t, outboxdriver.WriteRows), setup(t, outboxdriver.WriteMessage), setup(t, outboxdriver.WriteRows)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	releaseB, releaseC := holdLock(t, b), holdLock(t, c)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot, MaxPending: 20, ParkAfter: 300 * time.Millisecond}, nil)
	ba, bb, bc := memory.New(0), memory.New(0), memory.New(0)
	ra := a.startRelay(t, se.add(t, a), ba, nil)
	rb := a.startRelay(t, se.add(t, b), bb, &relay.Config{LeaderRetry: 100 * time.Millisecond})
	a.startRelay(t, se.add(t, c), bc, &relay.Config{LeaderRetry: 100 * time.Millisecond})
	testenv.WaitTell(t, ctx, "a's relay leading", func() bool { return ra.Stats().Leader }, func() string { return "standby" })

	b.produce(t, 2, 30) // 60 events each: three times the room, none of them done
	c.produce(t, 2, 30)
	a.produce(t, 3, 10)
	checkDelivery(t, waitMessages(t, ba, 30), 3, 10) // flowing past the parked b and c
	if n := len(bb.Messages()) + len(bc.Messages()); n != 0 || rb.Stats().Leader {
		t.Fatalf("b's and c's relays published %d events without their locks", n)
	}

	releaseB()
	releaseC()
	checkDelivery(t, waitMessages(t, bb, 60), 2, 30)
	checkDelivery(t, waitMessages(t, bc, 60), 2, 30)
	a.produceFrom(t, 3, 10, 5)
	checkDelivery(t, waitMessages(t, ba, 45), 3, 15)
	if n := len(a.settled(t, ra, ba)); n != 45 {
		t.Fatalf("a's relay published %d events, want 45: the stream read again sent some of a's again", n)
	}
}

// TestSharedSlotSpillsPastATable: a table whose events cannot get done (its relay
// cannot lead) fills the stream's room; its later rows are held without their
// payloads, so another table's events committed after them are read and published,
// with no table parked. Once its relay leads, it reads the spilled rows' payloads
// from its table and publishes every event, in order, once.
func TestSharedSlotSpillsPastATable(t *testing.T) {
	t.Parallel()
	a, b := setup(t, outboxdriver.WriteRows), setup(t, outboxdriver.WriteRows)
	ctx := context.Background()
	slot := sharedSlot(t, a)
	release := holdLock(t, a)
	se := startShared(t, a.pool, pgcdc.SharedConfig{Slot: slot, MaxPending: 20, ParkAfter: -1}, nil)
	ba, bb := memory.New(0), memory.New(0)
	ra := a.startRelay(t, se.add(t, a), ba, &relay.Config{LeaderRetry: 100 * time.Millisecond})
	rb := b.startRelay(t, se.add(t, b), bb, nil)
	testenv.WaitTell(t, ctx, "b's relay leading", func() bool { return rb.Stats().Leader }, func() string { return "standby" })

	a.produce(t, 3, 40) // 120 events: six times the room, none of them done
	b.produce(t, 2, 10)
	checkDelivery(t, waitMessages(t, bb, 20), 2, 10) // read past a's, which wait
	if n := len(ba.Messages()); n != 0 || ra.Stats().Leader {
		t.Fatalf("a's relay published %d events without its lock", n)
	}

	release()
	checkDelivery(t, waitMessages(t, ba, 120), 3, 40)
	if n := len(a.settled(t, ra, ba)); n != 120 {
		t.Fatalf("a's relay published %d events, want 120 once each", n)
	}
	if n := len(b.settled(t, rb, bb)); n != 20 {
		t.Fatalf("b's relay published %d events, want 20 once each", n)
	}
}

// spillEnv is two rows-mode tables on one shared slot with both relays leading, and
// a's broker down: a's events cannot get done, so past the room they are spilled.
type spillEnv struct {
	a, b   *cdcEnv
	ba, bb *memory.Broker
	ra     *relay.Relay
}

func startSpill(t *testing.T, maxPending int, cfgA *relay.Config) *spillEnv {
	t.Helper()
	se := &spillEnv{a: setup(t, outboxdriver.WriteRows), b: setup(t, outboxdriver.WriteRows), ba: memory.New(0), bb: memory.New(0)}
	slot := sharedSlot(t, se.a)
	sh := startShared(t, se.a.pool, pgcdc.SharedConfig{Slot: slot, MaxPending: maxPending, ParkAfter: -1}, nil)
	se.ba.SetDown(true)
	se.ra = se.a.startRelay(t, sh.add(t, se.a), se.ba, cfgA)
	rb := se.b.startRelay(t, sh.add(t, se.b), se.bb, nil)
	for _, r := range []*relay.Relay{se.ra, rb} {
		testenv.WaitTell(t, context.Background(), "the relays leading", func() bool { return r.Stats().Leader }, func() string { return "standby" })
	}
	return se
}

// readPast writes an event to b and waits until it is published: the stream has
// read every event of a's committed before it.
func (se *spillEnv) readPast(t *testing.T) {
	t.Helper()
	n := len(se.bb.Messages())
	se.b.produceFrom(t, 1, n, 1)
	waitMessages(t, se.bb, n+1)
}

// TestSharedSlotSpilledDeadLetters: events held without their payloads keep them
// on every path: sent again while the broker is down, moved to the dead letters
// behind a refused event of their aggregate, and replayed from there.
func TestSharedSlotSpilledDeadLetters(t *testing.T) {
	t.Parallel()
	se := startSpill(t, 5, &relay.Config{MaxAttempts: 2, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	a, ba := se.a, se.ba
	ctx := context.Background()
	ba.Refuse("agg-0", true)
	produced := a.produce(t, 3, 20)
	se.readPast(t) // all but 5 of a's events spilled

	ba.SetDown(false)
	msgs := waitMessages(t, ba, 2*20)
	for _, m := range msgs {
		if m.AggregateID == "agg-0" {
			t.Fatalf("a refused aggregate's event was published: %+v", m)
		}
	}
	var dead []outboxdriver.DeadLetter
	testenv.WaitTell(t, ctx, "the refused aggregate's 20 events in the dead letters", func() bool {
		var err error
		if dead, err = a.admin(t).ListDead(ctx, &outboxdriver.DeadFilter{AggregateID: "agg-0"}); err != nil {
			t.Fatal(err)
		}
		return len(dead) == 20
	}, func() string { return fmt.Sprintf("%d of 20", len(dead)) })
	for _, d := range dead {
		if !strings.HasPrefix(string(d.Payload), `{"i":`) {
			t.Fatalf("dead letter %s of seq %d has payload %q", d.ID, d.Seq, d.Payload)
		}
	}
	ba.RefuseNone("agg-0")
	if n, err := a.admin(t).ReplayDead(ctx, &outboxdriver.DeadFilter{AggregateID: "agg-0"}); err != nil || n != 20 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	waitDelivered(t, a, ba, produced)
	checkDelivery(t, ba.Messages(), 3, 20)
}

// TestSharedSlotSpilledRowGone: a spilled event whose row is gone from the table when
// its claim reads the payload (deleted by hand) is skipped, not sent empty, and the
// rest flows: the aggregate's events published are a prefix of its own (those still
// held whole), every other aggregate's arrive whole and in order.
func TestSharedSlotSpilledRowGone(t *testing.T) {
	t.Parallel()
	se := startSpill(t, 5, nil)
	a, ba, ra := se.a, se.ba, se.ra
	ctx := context.Background()
	a.produce(t, 3, 10)
	se.readPast(t) // all but 5 of a's events spilled
	if _, err := a.pool.Exec(ctx, `DELETE FROM `+pgx.Identifier{a.table.Schema, a.table.Name}.Sanitize()+` WHERE aggregateid = 'agg-1'`); err != nil {
		t.Fatal(err)
	}
	ba.SetDown(false)
	next := map[string]int{}
	for _, m := range a.settled(t, ra, ba) {
		var i int
		if _, err := fmt.Sscanf(string(m.Payload), `{"i":%d}`, &i); err != nil {
			t.Fatalf("payload %q of %s: %v", m.Payload, m.AggregateID, err)
		}
		if i != next[m.AggregateID] {
			t.Fatalf("aggregate %s: got event %d, expected %d", m.AggregateID, i, next[m.AggregateID])
		}
		next[m.AggregateID]++
	}
	if next["agg-0"] != 10 || next["agg-2"] != 10 || next["agg-1"] > 5 {
		t.Fatalf("published per aggregate %v: want agg-0 and agg-2 whole, of agg-1 at most the 5 held whole", next)
	}
}

// TestSharedSlotSpilledHeaders: a spilled event's headers are held no more than its
// payload, and come back from the table as they were written.
func TestSharedSlotSpilledHeaders(t *testing.T) {
	t.Parallel()
	se := startSpill(t, 2, nil)
	a, ba := se.a, se.ba
	ctx := context.Background()
	w, err := outbox.NewWriter(a.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := range n {
		ev := outbox.Event{AggregateType: "order", AggregateID: "agg-0", Type: "Step", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
		if i%2 == 0 {
			ev.Headers = map[string]string{"correlationId": fmt.Sprint("c-", i), "note": "ünïcode, \"quoted\""}
		}
		if err := w.Write(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	se.readPast(t) // all but 2 of a's events spilled
	ba.SetDown(false)
	msgs := waitMessages(t, ba, n)
	checkDelivery(t, msgs, 1, n)
	for i, m := range msgs {
		own := map[string]string{} // the event's own, without the wire format's
		for _, k := range []string{"correlationId", "note"} {
			if v, ok := m.Headers[k]; ok {
				own[k] = v
			}
		}
		want := map[string]string{}
		if i%2 == 0 {
			want = map[string]string{"correlationId": fmt.Sprint("c-", i), "note": "ünïcode, \"quoted\""}
		}
		if !maps.Equal(own, want) {
			t.Fatalf("event %d: headers %v, want %v among them", i, m.Headers, want)
		}
	}
}
