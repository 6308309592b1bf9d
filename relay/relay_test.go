package relay_test

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	natspub "github.com/outboxd/outbox/broker/nats"
	"github.com/outboxd/outbox/broker/nats/natstest"
	"github.com/outboxd/outbox/internal/natsembed"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	pool  *pgxpool.Pool
	drv   *outboxpgx.Driver
	store outboxdriver.Store
	w     *outbox.Writer[pgx.Tx]
	table outboxdriver.Table
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupB(t)
}

func setupB(t testing.TB) *env {
	t.Helper()
	url := testenv.DatabaseURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	schema := testenv.Schema(t, url)
	// Sessions are named after the test's schema, so a test can find and kill its own.
	cfg.ConnConfig.RuntimeParams["application_name"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	table := outboxdriver.Table{Schema: schema}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	store, _ := drv.Store()
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{pool: pool, drv: drv, store: store, w: w, table: table.WithDefaults()}
}

func quietLogger() *slog.Logger { return testenv.QuietLogger() }

func startRelay(t *testing.T, e *env, pub broker.Publisher, cfg *relay.Config) *relay.Relay {
	t.Helper()
	return relaytest.Start(t, e.store, pub, cfg)
}

// produce writes perAgg events for each of aggs aggregates from several goroutines,
// each in its own transaction; every third transaction also writes an event and rolls
// back. It returns the committed ids per aggregate in write order.
func produce(t *testing.T, e *env, aggs, perAgg int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := make(map[string][]string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, aggs)
	for a := 0; a < aggs; a++ {
		wg.Add(1)
		go func(agg string) {
			defer wg.Done()
			for i := 0; i < perAgg; i++ {
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				ev := outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Step", Payload: []byte(`{"i":` + strconv.Itoa(i) + `}`)}
				evs := []outbox.Event{ev}
				if err := e.w.WriteTx(ctx, tx, evs...); err != nil {
					errs <- err
					return
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
				if i%3 == 2 {
					// A transaction that writes an event and rolls back.
					rtx, err := e.pool.Begin(ctx)
					if err != nil {
						errs <- err
						return
					}
					phantom := []outbox.Event{{AggregateType: "order", AggregateID: agg, Type: "Phantom", Payload: []byte(`{}`)}}
					if err := e.w.WriteTx(ctx, rtx, phantom...); err != nil {
						errs <- err
						return
					}
					_ = rtx.Rollback(ctx)
				}
				mu.Lock()
				out[agg] = append(out[agg], evs[0].ID)
				mu.Unlock()
			}
		}("agg-" + strconv.Itoa(a))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// checkDelivery asserts that every committed id arrived, in order per aggregate, and
// that nothing else (no phantom) did.
func checkDelivery(t *testing.T, want map[string][]string, got []broker.Message) {
	t.Helper()
	pos := map[string]int{}
	agg := map[string]string{}
	total := 0
	for a, ids := range want {
		for i, id := range ids {
			pos[id], agg[id] = i, a
		}
		total += len(ids)
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range got {
		i, ok := pos[m.ID]
		if !ok {
			t.Fatalf("published an event that was never committed: %s (%s)", m.ID, m.Headers["eventType"])
		}
		if m.Headers["eventType"] == "Phantom" {
			t.Fatalf("published a rolled-back event %s", m.ID)
		}
		a := agg[m.ID]
		if p, ok := last[a]; ok && i < p && !seen[m.ID] {
			t.Fatalf("aggregate %s: event %d published after %d", a, i, p)
		}
		if i > last[a] || !seen[m.ID] {
			last[a] = max(last[a], i)
		}
		seen[m.ID] = true
	}
	if len(seen) != total {
		t.Fatalf("published %d distinct events, want %d", len(seen), total)
	}
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRelayDeliversInOrderNoPhantoms(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := memory.New(0)
	startRelay(t, e, b, &relay.Config{BatchSize: 50})
	want := produce(t, e, 8, 60)
	got, err := b.Wait(waitCtx(t), "", 8*60)
	if err != nil {
		t.Fatal(err)
	}
	checkDelivery(t, want, got)
	if got[0].Topic != "outbox.event.order" || got[0].Key == "" || got[0].Headers["id"] != got[0].ID {
		t.Fatalf("wire format: %+v", got[0])
	}
}

func TestRelayLateCommitNotSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := memory.New(0)
	ctx := waitCtx(t)
	slow, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	late := []outbox.Event{{AggregateType: "order", AggregateID: "slow", Type: "Late", Payload: []byte(`{}`)}}
	if err := e.w.WriteTx(ctx, slow, late...); err != nil {
		t.Fatal(err)
	}
	startRelay(t, e, b, &relay.Config{PollInterval: 20 * time.Millisecond})
	fast := []outbox.Event{{AggregateType: "order", AggregateID: "fast", Type: "Early", Payload: []byte(`{}`)}}
	if err := e.w.Write(ctx, fast...); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, "", 1); err != nil {
		t.Fatal(err)
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := b.Wait(ctx, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].ID != fast[0].ID || got[1].ID != late[0].ID {
		t.Fatalf("got %s, %s; want the early then the late event", got[0].ID, got[1].ID)
	}
}

// TestRelayCompletionModes: with delete and archive completion the outbox table is
// left empty once everything is published; the archive keeps every event, stamped.
func TestRelayCompletionModes(t *testing.T) {
	for _, tc := range []struct {
		completion outboxdriver.Completion
		kept       int64 // published rows status reports afterwards
	}{{outboxdriver.CompleteDelete, 0}, {outboxdriver.CompleteArchive, 30}} {
		t.Run(string(tc.completion), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			b := memory.New(0)
			startRelay(t, e, b, &relay.Config{Completion: tc.completion})
			evs := make([]outbox.Event, 30)
			for i := range evs {
				evs[i] = outbox.Event{AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{}`)}
			}
			ctx := waitCtx(t)
			if err := e.w.Write(ctx, evs...); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Wait(ctx, "", 30); err != nil {
				t.Fatal(err)
			}
			// Completion happens after the broker's answer; wait for the rows to go.
			testenv.Wait(t, ctx, "every row completed", func() bool {
				st, err := e.store.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return st.Unpublished == 0 && st.Published == tc.kept
			})
			var inTable, stamped int64
			if err := e.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+pgx.Identifier{e.table.Schema, "outbox"}.Sanitize()+`),
       (SELECT count(*) FROM `+pgx.Identifier{e.table.Schema, "outbox_published"}.Sanitize()+` WHERE published_at IS NOT NULL)`).Scan(&inTable, &stamped); err != nil {
				t.Fatal(err)
			}
			if inTable != 0 || stamped != tc.kept {
				t.Fatalf("%d rows left in the table, %d stamped in the archive", inTable, stamped)
			}
		})
	}
}

// TestBrokerOutageOnlyDelays stops a real NATS server while events flow: nothing is
// lost, order holds, and no event spends an attempt on the outage.
func TestBrokerOutageOnlyDelays(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	ctx := waitCtx(t)
	pub, err := natspub.Dial(ctx, srv.URL(), &natspub.Config{CreateStream: true, AckTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r := startRelay(t, e, pub, &relay.Config{BatchSize: 20, PollInterval: 20 * time.Millisecond})

	var want map[string][]string
	done := make(chan struct{})
	go func() {
		defer close(done)
		want = produce(t, e, 4, 45)
	}()
	// Take the broker away while the producers write, then bring it back.
	testenv.Wait(t, ctx, "20 events published", func() bool { return r.Stats().Published >= 20 })
	srv.Stop()
	testenv.Wait(t, ctx, "the relay finding the broker down", func() bool {
		return !r.Stats().BrokerDownSince.IsZero() || r.Stats().Published >= 4*45 // or nothing was left to send
	})
	down := r.Stats()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	<-done
	got := readStream(t, ctx, srv.URL(), 4*45)
	checkDelivery(t, want, got)
	var attempts int
	if err := e.pool.QueryRow(ctx, "SELECT coalesce(sum(attempts), 0) FROM "+
		pgx.Identifier{e.table.Schema, e.table.Name}.Sanitize()).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("the outage cost %d attempts; it must cost none", attempts)
	}
	t.Logf("published before the outage: %d; failed publishes during it: %d", down.Published, r.Stats().Failed)
}

func TestConfigValidation(t *testing.T) {
	b := memory.New(0)
	for name, cfg := range map[string]relay.Config{
		"batch":    {BatchSize: -1},
		"backoff":  {BackoffMin: time.Second, BackoffMax: time.Millisecond},
		"template": {TopicTemplate: "outbox.${nope}"},
		"negative": {PollInterval: -time.Second},
	} {
		if _, err := relay.New(storeStub{}, b, &cfg); err == nil {
			t.Errorf("%s: config accepted", name)
		}
	}
	if _, err := relay.New(nil, b, nil); err == nil {
		t.Error("nil store accepted")
	}
	if _, err := relay.New(storeStub{}, nil, nil); err == nil {
		t.Error("nil publisher accepted")
	}
}

// storeStub only satisfies the type for constructor checks; it is never run.
type storeStub struct{ outboxdriver.Store }

func readStream(t *testing.T, ctx context.Context, url string, n int) []broker.Message {
	t.Helper()
	msgs, err := natstest.Read(ctx, url, natspub.StreamNameDefault, ">", n)
	if err != nil {
		t.Fatalf("read stream: %v (got %d of %d)", err, len(msgs), n)
	}
	return msgs
}

// terminate kills the backends whose current query starts with prefix and reports how
// many it killed.
func terminate(t *testing.T, e *env, prefix string) int {
	t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND application_name = $1 AND query LIKE $2`, e.table.Schema, prefix+"%").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// writeOne writes one event with a writer that notifies on every write (no debounce),
// so tests about wake-ups do not depend on timing.
func writeOne(t *testing.T, e *env, agg string) string {
	t.Helper()
	w, err := outbox.NewWriter(e.drv, &outbox.Config{NotifyInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	evs := []outbox.Event{{AggregateType: "order", AggregateID: agg, Type: "T", Payload: []byte(`{}`)}}
	if err := w.Write(context.Background(), evs...); err != nil {
		t.Fatal(err)
	}
	return evs[0].ID
}

// TestListenerKilled: notifications are only a hint. When the LISTEN session dies, the
// poll still delivers, and the relay listens again.
func TestListenerKilled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := memory.New(0)
	startRelay(t, e, b, &relay.Config{PollInterval: 3 * time.Second})
	ctx := waitCtx(t)
	// Wait for the listener, then check a write is delivered well before the poll.
	testenv.Wait(t, ctx, "the relay listening", func() bool { return terminateCount(t, e) > 0 })
	writeOne(t, e, "a")
	fast, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := b.Wait(fast, "", 1); err != nil {
		t.Fatalf("a notified write was not relayed before the poll interval: %v", err)
	}
	if n := terminate(t, e, "LISTEN"); n != 1 {
		t.Fatalf("terminated %d LISTEN sessions, want 1", n)
	}
	writeOne(t, e, "b") // its notification may be lost: the poll must deliver it
	if _, err := b.Wait(ctx, "", 2); err != nil {
		t.Fatal(err)
	}
	testenv.Wait(t, ctx, "the relay listening again", func() bool { return terminateCount(t, e) > 0 })
	writeOne(t, e, "c")
	fast2, cancel2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel2()
	if _, err := b.Wait(fast2, "", 3); err != nil {
		t.Fatalf("after the listener came back, a write waited for the poll: %v", err)
	}
}

func terminateCount(t *testing.T, e *env) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND query LIKE 'LISTEN %'`, e.table.Schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLeaderSessionKilled: the session holding the leadership lock dies; the relay
// notices, takes leadership again and keeps delivering.
func TestLeaderSessionKilled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := memory.New(0)
	r := startRelay(t, e, b, &relay.Config{PollInterval: 50 * time.Millisecond, LeaderCheck: 50 * time.Millisecond})
	ctx := waitCtx(t)
	writeOne(t, e, "a")
	if _, err := b.Wait(ctx, "", 1); err != nil {
		t.Fatal(err)
	}
	if !r.Stats().Leader {
		t.Fatal("relay does not report leadership")
	}
	var n int // the leadership lock is the exclusive one (claims hold a shared fence)
	if err := e.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
		JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND a.application_name = $1`,
		e.table.Schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("terminated %d leadership sessions, want 1", n)
	}
	writeOne(t, e, "b")
	if _, err := b.Wait(ctx, "", 2); err != nil {
		t.Fatal(err)
	}
}

// TestRelayCleanup: the active relay deletes published rows past the retention and
// leaves the others.
func TestRelayCleanup(t *testing.T) {
	t.Parallel()
	e := setup(t)
	mem := memory.New(0)
	ctx := waitCtx(t)
	evs := []outbox.Event{{AggregateType: "order", AggregateID: "a", Type: "T", Payload: []byte(`{}`)},
		{AggregateType: "order", AggregateID: "b", Type: "T", Payload: []byte(`{}`), NotBefore: time.Now().Add(time.Hour)}}
	if err := e.w.Write(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, e, mem, &relay.Config{PollInterval: 10 * time.Millisecond, Retention: time.Millisecond, CleanupEvery: 20 * time.Millisecond})
	testenv.Wait(t, ctx, "a cleanup", func() bool { return r.Stats().Cleaned >= 1 })
	st, err := e.store.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Published != 0 || st.Unpublished != 1 {
		t.Fatalf("after cleanup: %+v; want the published row gone and the delayed one kept", st)
	}
}

// TestGroupExcludesSingleRelay: a group member waits while a relay outside the group
// is active on the table, and takes over when it stops.
func TestGroupExcludesSingleRelay(t *testing.T) {
	e := setup(t)
	b := memory.New(0)
	single := startRelay(t, e, b, nil)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testenv.Wait(t, waitCtx(t), what, cond)
	}
	waitFor("the single relay to lead", func() bool { return single.Stats().Leader })
	member := startRelay(t, e, b, &relay.Config{Group: &relay.GroupConfig{RelayID: "m", LeaseTTL: time.Second}})
	testenv.WaitTurns(t, waitCtx(t), "the member's tries to join", 3, func() int64 { return member.Stats().Standby })
	if member.Stats().Leader {
		t.Fatal("a group member runs alongside the single active relay")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := single.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor("the member to own every partition", func() bool { return member.Stats().Partitions == 64 })
	produce(t, e, 4, 20)
	if _, err := b.Wait(ctx, "", 80); err != nil {
		t.Fatalf("%v: %d of 80 published by the member", err, len(b.Messages()))
	}
}

// TestDebouncedWriteFoundAfterLinger: a writer sends one notification per interval,
// so the last write of a burst may have none; after a pass a notification drove, the
// relay looks once more after NotifyLinger. With a poll interval of an hour, only that
// look publishes the second write. (Here the prefetched claim comes back empty before
// the batch's write-back, so this order passed before the linger was kept armed past
// the write-back too; the interleaving that lost it, seen in bench's live load, is
// not forced here.)
// TestWriteBeforeListenFound: a write committed while the relay's listening session was
// not up yet (its notification reached no one) is found once the session is, not a
// poll interval later: the relay looks once each time it starts listening. (Found by
// CI: TestDebouncedWriteFoundAfterLinger wrote its first event right after the first
// claim, before the listener had connected, and waited for a poll interval of an hour.)
func TestWriteBeforeListenFound(t *testing.T) {
	t.Parallel()
	e := setup(t)
	store := &gatedListen{Store: e.store, entered: make(chan struct{}), gate: make(chan struct{})}
	mem := memory.New(0)
	r := relaytest.Start(t, store, mem, &relay.Config{PollInterval: time.Hour})
	ctx := waitCtx(t)
	testenv.Wait(t, ctx, "the relay's first claim", func() bool { return r.Stats().Claims >= 1 })
	select {
	case <-store.entered: // the listener is connecting, not listening yet
	case <-ctx.Done():
		t.Fatal("the relay never listened")
	}
	w, err := outbox.NewWriter(e.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "a", Type: "OrderPlaced", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	close(store.gate)
	if _, err := mem.Wait(ctx, "outbox.event.order", 1); err != nil {
		t.Fatalf("a write committed before the relay listened waited for the poll interval: %v", err)
	}
}

// gatedListen holds the relay's first Listen until gate is closed.
type gatedListen struct {
	outboxdriver.Store
	entered, gate chan struct{}
	once          sync.Once
}

func (g *gatedListen) Listen(ctx context.Context) (outboxdriver.Listener, error) {
	g.once.Do(func() { close(g.entered) })
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Store.Listen(ctx)
}

func TestDebouncedWriteFoundAfterLinger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	w, err := outbox.NewWriter(e.drv, &outbox.Config{NotifyInterval: time.Hour}) // the first write notifies, no other
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.New(0)
	r := startRelay(t, e, mem, &relay.Config{PollInterval: time.Hour, NotifyLinger: 5 * time.Second})
	ctx := waitCtx(t)
	testenv.Wait(t, ctx, "the relay's first claim", func() bool { return r.Stats().Claims >= 1 })
	write := func(id string) {
		if err := w.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "OrderPlaced", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	write("a") // notifies: the relay wakes and publishes it
	if _, err := mem.Wait(ctx, "outbox.event.order", 1); err != nil {
		t.Fatal(err)
	}
	write("b") // no notification: found by the linger's look, within 5 s
	if _, err := mem.Wait(ctx, "outbox.event.order", 2); err != nil {
		t.Fatalf("the debounced write was not published (the relay waited for its poll interval): %v", err)
	}
}
