package pgcdc_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxpgx"
	"github.com/outboxd/outbox/pgcdc"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cdcEnv is a migrated outbox table in a schema of the test's own, with its slot and
// publication dropped when the test ends.
type cdcEnv struct {
	url   string
	pool  *pgxpool.Pool
	table outboxdriver.Table
	drv   *outboxpgx.Driver
	slot  string
}

func setup(t testing.TB, mode outboxdriver.WriteMode) *cdcEnv {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	testenv.LogicalReplication(t, pool)
	schema := testenv.Schema(t, url)
	table := outboxdriver.Table{Schema: schema, Write: mode}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	e := &cdcEnv{url: url, pool: pool, table: table.WithDefaults(), drv: drv, slot: pgcdc.DefaultSlot(table)}
	t.Cleanup(func() { dropSlot(t, pool, e.slot) })
	return e
}

// dropSlot removes a test's slot and publication: a forgotten slot pins WAL forever.
func dropSlot(t testing.TB, pool *pgxpool.Pool, slot string) {
	t.Helper()
	if err := testenv.DropSlot(context.Background(), pool, slot); err != nil {
		t.Error(err)
	}
}

func quiet() *slog.Logger { return testenv.QuietLogger() }

func (e *cdcEnv) source(t testing.TB, cfg *pgcdc.Config) *pgcdc.Source {
	t.Helper()
	if cfg == nil {
		cfg = &pgcdc.Config{}
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 100 * time.Millisecond
	}
	src, err := pgcdc.ForDriver(e.drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return src
}

// admin is the table store: status and dead letters (the CDC source is only the
// relay's side).
func (e *cdcEnv) admin(t testing.TB) outboxdriver.Store {
	t.Helper()
	s, err := e.drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *cdcEnv) startRelay(t testing.TB, store outboxdriver.Source, pub broker.Publisher, cfg *relay.Config) *relay.Relay {
	t.Helper()
	return relaytest.Start(t, store, pub, cfg)
}

// produce writes perAgg events for each of aggs aggregates, each in its own
// transaction, from one goroutine per aggregate; every third transaction also writes
// an event and rolls back. It returns the committed ids per aggregate in write order.
func (e *cdcEnv) produce(t testing.TB, aggs, perAgg int) map[string][]string {
	t.Helper()
	return e.produceFrom(t, aggs, 0, perAgg)
}

// produceFrom is produce with payloads counting from from: the events after
// those of an earlier produce.
func (e *cdcEnv) produceFrom(t testing.TB, aggs, from, perAgg int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(e.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, aggs)
	for a := range aggs {
		wg.Add(1)
		go func(agg string) {
			defer wg.Done()
			for i := from; i < from+perAgg; i++ {
				ev := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: agg, Type: "Step", Payload: []byte(`{"i":` + strconv.Itoa(i) + `}`)}
				err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, ev) })
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				out[agg] = append(out[agg], ev.ID)
				mu.Unlock()
				if i%3 == 2 {
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						errs <- err
						return
					}
					if err := w.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Phantom", Payload: []byte(`{}`)}); err != nil {
						errs <- err
						return
					}
					_ = tx.Rollback(ctx)
				}
			}
		}("agg-" + strconv.Itoa(a))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return out
}

// checkDelivery checks every aggregate got its perAgg events in order (payload i
// counts up), with nothing rolled back, duplicates allowed only as repeats.
func checkDelivery(t testing.TB, msgs []broker.Message, aggs, perAgg int) (dups int) {
	t.Helper()
	next := map[string]int{}
	for _, m := range msgs {
		if m.EventType == "Phantom" {
			t.Fatalf("a rolled-back event was published: %s", m.ID)
		}
		var i int
		if _, err := fmt.Sscanf(string(m.Payload), `{"i":%d}`, &i); err != nil {
			t.Fatalf("payload %q: %v", m.Payload, err)
		}
		n := next[m.AggregateID]
		switch {
		case i == n:
			next[m.AggregateID] = n + 1
		case i < n:
			dups++ // a repeat of an earlier one (after a crash)
		default:
			t.Fatalf("aggregate %s: got event %d, expected %d: order broken or an event lost", m.AggregateID, i, n)
		}
	}
	for a := range aggs {
		if got := next["agg-"+strconv.Itoa(a)]; got != perAgg {
			t.Fatalf("aggregate agg-%d: %d of %d events delivered", a, got, perAgg)
		}
	}
	return dups
}

func waitMessages(t testing.TB, b *memory.Broker, n int) []broker.Message {
	t.Helper()
	testenv.WaitTell(t, context.Background(), fmt.Sprintf("%d messages", n), func() bool { return len(b.Messages()) >= n },
		func() string { return fmt.Sprintf("only %d arrived", len(b.Messages())) })
	return b.Messages()
}

// waitRows waits until e's table holds at least n rows.
func (e *cdcEnv) waitRows(t testing.TB, n int) {
	t.Helper()
	q := `SELECT count(*) FROM ` + pgx.Identifier{e.table.Schema, e.table.Name}.Sanitize()
	testenv.Wait(t, context.Background(), fmt.Sprintf("%d rows written", n), func() bool {
		var got int
		return e.pool.QueryRow(context.Background(), q).Scan(&got) == nil && got >= n
	})
}

// settled shows that nothing more comes of what was written to e so far, and returns
// b's messages without its sign: it writes one more event (the sign) and waits
// until b has it, then for three turns of r's loop. The stream is read in commit
// order, so an event sent again (or a phantom) would have been taken before the
// sign; the turns see the batch they came in finished. Waiting for signs, not for
// time, holds on a machine of any speed.
func (e *cdcEnv) settled(t testing.TB, r *relay.Relay, b *memory.Broker) []broker.Message {
	t.Helper()
	ctx := context.Background()
	w, err := outbox.NewWriter(e.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	sign := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "sign", AggregateID: "sign", Type: "Sign", Payload: []byte(`{}`)}
	if err := w.Write(ctx, sign); err != nil {
		t.Fatal(err)
	}
	seen := func() bool {
		for _, m := range b.Messages() {
			if m.ID == sign.ID {
				return true
			}
		}
		return false
	}
	testenv.Wait(t, ctx, "the sign written after the events", seen)
	testenv.WaitTurns(t, ctx, "the relay", 3, func() int64 { return r.Stats().Claims })
	var out []broker.Message
	for _, m := range b.Messages() {
		if m.ID != sign.ID {
			out = append(out, m)
		}
	}
	return out
}

func TestRowsInOrderNoPhantoms(t *testing.T) {
	t.Parallel()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteInsertDelete, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			e := setup(t, mode)
			b := memory.New(0)
			r := e.startRelay(t, e.source(t, nil), b, nil)
			const aggs, per = 8, 60
			e.produce(t, aggs, per)
			msgs := waitMessages(t, b, aggs*per)
			if dups := checkDelivery(t, e.settled(t, r, b), aggs, per); dups != 0 {
				t.Fatalf("%d duplicates without any crash", dups)
			}
			if msgs[0].Topic != "outbox.event.order" || msgs[0].Headers == nil && msgs[0].ID == "" {
				t.Fatalf("wire format: %+v", msgs[0])
			}
			var rows int
			if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{e.table.Schema, "outbox"}.Sanitize()).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			want := map[outboxdriver.WriteMode]int{outboxdriver.WriteRows: aggs*per + 1}[mode] // and settled's sign
			if rows != want {
				t.Fatalf("%d rows in the table in mode %s, want %d", rows, mode, want)
			}
		})
	}
}

// The rows a CDC relay publishes are completed in the table, as the relay's
// completion says, so status, cleanup and a polling relay taking over see them
// published.
func TestPublishedRowsCompleted(t *testing.T) {
	t.Parallel()
	for _, c := range []outboxdriver.Completion{outboxdriver.CompleteMark, outboxdriver.CompleteDelete, outboxdriver.CompleteArchive} {
		t.Run(string(c), func(t *testing.T) {
			e := setup(t, outboxdriver.WriteRows)
			b := memory.New(0)
			e.startRelay(t, e.source(t, nil), b, &relay.Config{Completion: c})
			const aggs, per = 4, 25
			e.produce(t, aggs, per)
			waitMessages(t, b, aggs*per)
			ctx := context.Background()
			count := func(table, where string) int {
				var n int
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{e.table.Schema, table}.Sanitize()+` WHERE `+where).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			want := map[outboxdriver.Completion][3]int{ // marked, in the table, archived
				outboxdriver.CompleteMark:    {aggs * per, aggs * per, 0},
				outboxdriver.CompleteDelete:  {0, 0, 0},
				outboxdriver.CompleteArchive: {0, 0, aggs * per},
			}[c]
			var got [3]int
			testenv.WaitTell(t, ctx, "the published rows completed", func() bool {
				got = [3]int{count("outbox", "published_at IS NOT NULL"), count("outbox", "true"), count("outbox_published", "true")}
				return got == want
			}, func() string { return fmt.Sprintf("marked, in the table, archived: %v, want %v", got, want) })
			if st, err := e.admin(t).Status(ctx); err != nil || st.Unpublished != 0 {
				t.Fatalf("status after the relay: %+v, %v", st, err)
			}
		})
	}
}

// TestSeqAcrossWriteModes: one aggregate written as rows, insert-deletes and
// table-less messages, switching mode between transactions, arrives with outbox-seq
// increasing in write order (a message's number comes from the table's sequence).
func TestSeqAcrossWriteModes(t *testing.T) {
	t.Parallel()
	e := setup(t, outboxdriver.WriteRows)
	b := memory.New(0)
	e.startRelay(t, e.source(t, nil), b, nil)
	ctx := context.Background()
	modes := []outboxdriver.WriteMode{outboxdriver.WriteMessage, outboxdriver.WriteRows, outboxdriver.WriteInsertDelete,
		outboxdriver.WriteMessage, outboxdriver.WriteInsertDelete, outboxdriver.WriteRows, outboxdriver.WriteMessage}
	for i, mode := range modes {
		table := e.table
		table.Write = mode
		w, err := outbox.NewWriter(outboxpgx.New(e.pool, &table), nil)
		if err != nil {
			t.Fatal(err)
		}
		// Two events per transaction: the order within one holds too.
		evs := []outbox.Event{
			{AggregateType: "order", AggregateID: "agg-0", Type: string(mode), Payload: []byte(fmt.Sprintf(`{"i":%d}`, 2*i))},
			{AggregateType: "order", AggregateID: "agg-0", Type: string(mode), Payload: []byte(fmt.Sprintf(`{"i":%d}`, 2*i+1))},
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return w.WriteTx(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
	}
	msgs := waitMessages(t, b, 2*len(modes))
	checkDelivery(t, msgs, 1, 2*len(modes))
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Seq <= msgs[i-1].Seq {
			t.Fatalf("outbox-seq went from %d (%s) to %d (%s): not increasing in write order", msgs[i-1].Seq, msgs[i-1].EventType, msgs[i].Seq, msgs[i].EventType)
		}
	}
}
