package replay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
	"github.com/outboxd/outbox/replay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a migrated outbox table of the test's own, with its writer.
type env struct {
	url   string
	pool  *pgxpool.Pool
	drv   *outboxpgx.Driver
	table outboxdriver.Table
	w     *outbox.Writer[pgx.Tx]
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t, url)
	table := outboxdriver.Table{Schema: testenv.Schema(t, url)}
	drv := outboxpgx.New(pool, &table)
	m, _ := drv.Migrator()
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &env{url: url, pool: pool, drv: drv, table: table.WithDefaults(), w: w}
}

// cdc is a CDC source of the table, its slot dropped at cleanup.
func (e *env) cdc(t *testing.T) *pgcdc.Source {
	t.Helper()
	testenv.LogicalReplication(t, e.pool)
	s, err := pgcdc.ForDriver(e.drv, &pgcdc.Config{Logger: testenv.QuietLogger(), StatusInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DropSlot(context.Background(), e.pool, s.Slot()) })
	return s
}

// write writes n events per aggregate, one transaction per round, and returns the
// ids per aggregate in write order.
func (e *env) write(t *testing.T, aggType string, aggs, n int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	out := map[string][]string{}
	for i := range n {
		evs := make([]outbox.Event, aggs)
		for a := range aggs {
			evs[a] = outbox.Event{AggregateType: aggType, AggregateID: fmt.Sprintf("%s-%d", aggType, a), Type: "Added",
				Payload: []byte(fmt.Sprintf(`{"n":%d}`, i+1))}
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return e.w.WriteTx(ctx, tx, evs...) }); err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			out[ev.AggregateID] = append(out[ev.AggregateID], ev.ID)
		}
	}
	return out
}

// relayAll runs a relay with completion c until every written event is published.
func (e *env) relayAll(t *testing.T, src outboxdriver.Source, c outboxdriver.Completion, n int) *memory.Broker {
	t.Helper()
	b := memory.New(0)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := relay.New(src, b, &relay.Config{Completion: c, PollInterval: 20 * time.Millisecond, Logger: testenv.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.WaitTell(t, context.Background(), fmt.Sprintf("%d events relayed", n), func() bool { return len(b.Messages()) >= n },
		func() string { return fmt.Sprint(len(b.Messages())) })
	// and completed in the table (a CDC relay marks a moment after the broker's answer)
	testenv.Wait(t, context.Background(), "every relayed event completed", func() bool {
		h, err := replay.New(e.pool, e.table).History(context.Background())
		return err == nil && h.Events >= int64(n) || c == outboxdriver.CompleteDelete
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return b
}

// checkReplayed: every id of want arrived, in order per aggregate, marked as the
// named replay, with the payload the relay sent first.
func checkReplayed(t *testing.T, got []broker.Message, want map[string][]string, name string, first *memory.Broker) {
	t.Helper()
	orig := map[string]broker.Message{}
	if first != nil {
		for _, m := range first.Messages() {
			orig[m.ID] = m
		}
	}
	next := map[string]int{}
	for _, m := range got {
		ids := want[m.AggregateID]
		n := next[m.AggregateID]
		if n < len(ids) && ids[n] == m.ID {
			next[m.AggregateID]++
		} else if !contains(ids[:n], m.ID) {
			t.Fatalf("replayed %s of %s out of order or unknown (want %v)", m.ID, m.AggregateID, ids)
		}
		if m.Headers[replay.HeaderReplay] != name {
			t.Fatalf("replayed %s: header %s = %q, want %q", m.ID, replay.HeaderReplay, m.Headers[replay.HeaderReplay], name)
		}
		if o, ok := orig[m.ID]; ok && (string(o.Payload) != string(m.Payload) || o.Seq != m.Seq || o.Topic != m.Topic) {
			t.Fatalf("replayed %s differs from its first delivery: %+v vs %+v", m.ID, m, o)
		}
	}
	for agg, ids := range want {
		if next[agg] != len(ids) {
			t.Fatalf("aggregate %s: %d of %d events replayed", agg, next[agg], len(ids))
		}
	}
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestReplayKeptHistory: in mark and archive completion, from a polling and a CDC relay, the
// published events go out again with their ids, in order per aggregate, marked; a
// filter selects; the dry run counts per topic.
func TestReplayKeptHistory(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		completion outboxdriver.Completion
		cdc        bool
	}{{"mark", outboxdriver.CompleteMark, false}, {"archive", outboxdriver.CompleteArchive, false},
		{"cdc-mark", outboxdriver.CompleteMark, true}, {"cdc-archive", outboxdriver.CompleteArchive, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var src outboxdriver.Source
			if tc.cdc {
				src = e.cdc(t)
			} else {
				store, err := e.drv.Store()
				if err != nil {
					t.Fatal(err)
				}
				src = store
			}
			orders := e.write(t, "order", 3, 10)
			users := e.write(t, "user", 2, 5)
			first := e.relayAll(t, src, tc.completion, 40)
			r := replay.New(e.pool, e.table)
			ctx := context.Background()
			counts, err := r.DryRun(ctx, &replay.Filter{}, nil)
			if err != nil || counts["outbox.event.order"] != 30 || counts["outbox.event.user"] != 10 {
				t.Fatalf("dry run: %v, %v", counts, err)
			}
			b := memory.New(0)
			res, err := r.Run(ctx, b, &replay.Config{Name: "rebuild", Filter: replay.Filter{AggregateType: "order"}, Batch: 7})
			if err != nil || res.Sent != 30 || res.Resumed {
				t.Fatalf("replay: %+v, %v", res, err)
			}
			checkReplayed(t, b.Messages(), orders, "rebuild", first)
			// Another name, another destination, the users only, by write time.
			tmpl, _ := broker.ParseTemplate("rebuild.${aggregatetype}")
			b2 := memory.New(0)
			if _, err := r.Run(ctx, b2, &replay.Config{Name: "users", Topic: tmpl,
				Filter: replay.Filter{AggregateType: "user", ByCreation: true, Since: time.Now().Add(-time.Hour)}}); err != nil {
				t.Fatal(err)
			}
			got := b2.Messages()
			if len(got) != 10 || got[0].Topic != "rebuild.user" {
				t.Fatalf("the users replay: %d messages, first on %q", len(got), got[0].Topic)
			}
			h, err := r.History(ctx)
			if err != nil || h.Events != 40 || h.Oldest.IsZero() {
				t.Fatalf("history: %+v, %v", h, err)
			}
			_ = users
		})
	}
}

// TestReplayResumes: a replay the broker stops at an event keeps its checkpoint; run
// again it continues there and every event arrives, and none published after it
// started; a different selection under the same name is refused unless restarted.
func TestReplayResumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	store, err := e.drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	want := e.write(t, "order", 2, 20)
	e.relayAll(t, store, outboxdriver.CompleteMark, 40)
	r := replay.New(e.pool, e.table)
	ctx := context.Background()
	b := memory.New(0)
	b.Refuse("order-1", true)
	res, err := r.Run(ctx, b, &replay.Config{Name: "resume", Batch: 10})
	if err == nil || res.Sent == 0 || res.Sent >= 40 {
		t.Fatalf("a replay the broker refuses midway: %+v, %v; want an error after some events", res, err)
	}
	if _, err := r.Run(ctx, b, &replay.Config{Name: "resume", Filter: replay.Filter{AggregateID: "order-0"}}); !errors.Is(err, replay.ErrOtherSelection) {
		t.Fatalf("another selection under the unfinished name: %v, want ErrOtherSelection", err)
	}
	// Published after the replay started: live traffic, not the history it replays.
	e.write(t, "order", 2, 3)
	if _, err := e.pool.Exec(ctx, `UPDATE `+e.table.String()+` SET published_at = now() WHERE published_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	b.RefuseNone("order-1")
	res2, err := r.Run(ctx, b, &replay.Config{Name: "resume", Batch: 10})
	if err != nil || !res2.Resumed || res.Sent+res2.Sent != 40 {
		t.Fatalf("continued: %+v, %v; first run sent %d", res2, err, res.Sent)
	}
	var got []broker.Message
	seen := map[string]bool{}
	for _, m := range b.Messages() {
		if !seen[m.ID] {
			seen[m.ID] = true
			got = append(got, m)
		}
	}
	checkReplayed(t, got, want, "resume", nil)
	// Finished: the same name starts over.
	b3 := memory.New(0)
	if res, err := r.Run(ctx, b3, &replay.Config{Name: "resume", Filter: replay.Filter{AggregateID: "order-0"}}); err != nil || res.Sent != 23 || res.Resumed {
		t.Fatalf("a finished name run again: %+v, %v", res, err)
	}
}

// TestReplayRefusals: one replay of a name at a time; a table that keeps no history
// (delete completion) says so.
func TestReplayRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	store, err := e.drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	e.write(t, "order", 1, 5)
	e.relayAll(t, store, outboxdriver.CompleteDelete, 5)
	r := replay.New(e.pool, e.table)
	ctx := context.Background()
	if _, err := r.Run(ctx, memory.New(0), &replay.Config{Name: "x"}); !errors.Is(err, replay.ErrNoHistory) {
		t.Fatalf("a table in delete completion: %v, want ErrNoHistory", err)
	}
	e.write(t, "order", 1, 5)
	e.relayAll(t, store, outboxdriver.CompleteMark, 5)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	key := "outbox-replay:" + e.table.String() + ":busy"
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, memory.New(0), &replay.Config{Name: "busy"}); !errors.Is(err, replay.ErrRunning) {
		t.Fatalf("a replay of a running name: %v, want ErrRunning", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Run(ctx, memory.New(0), &replay.Config{Name: "busy"}); err != nil || res.Sent != 5 {
		t.Fatalf("once the other ended: %+v, %v", res, err)
	}
}

// TestReplayRefusesTableLess: events written table-less (logical messages) and relayed
// by a CDC relay leave no history in the table: replay says so, and sends nothing.
func TestReplayRefusesTableLess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src := e.cdc(t)
	e.table.Write = outboxdriver.WriteMessage
	w, err := outbox.NewWriter(outboxpgx.New(e.pool, &e.table), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	e.write(t, "order", 2, 5)
	b := memory.New(0)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := relay.New(src, b, &relay.Config{PollInterval: 20 * time.Millisecond, Logger: testenv.QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.WaitTell(t, context.Background(), "10 table-less events relayed", func() bool { return len(b.Messages()) >= 10 },
		func() string { return fmt.Sprint(len(b.Messages())) })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	again := memory.New(0)
	if _, err := replay.New(e.pool, e.table).Run(context.Background(), again, &replay.Config{Name: "x"}); !errors.Is(err, replay.ErrNoHistory) || len(again.Messages()) != 0 {
		t.Fatalf("a table-less CDC outbox: %v, %d sent; want ErrNoHistory and nothing", err, len(again.Messages()))
	}
}

// columnRouter reads a custom column, which the history does not keep.
type columnRouter struct{}

func (columnRouter) Route(row *outboxdriver.Row, _ func(string) string) (broker.Message, error) {
	return broker.Message{ID: row.ID}, nil
}
func (columnRouter) Columns() []string { return []string{"tenant"} }

// TestReplayRefusesColumnRouter: a router that reads custom columns (a Debezium
// table's placements) is refused before anything is sent.
func TestReplayRefusesColumnRouter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.write(t, "order", 1, 1)
	if _, err := e.pool.Exec(context.Background(), `UPDATE `+e.table.String()+` SET published_at = now()`); err != nil {
		t.Fatal(err)
	}
	b := memory.New(0)
	_, err := replay.New(e.pool, e.table).Run(context.Background(), b, &replay.Config{Router: columnRouter{}})
	if !errors.Is(err, outboxdriver.ErrNotSupported) || len(b.Messages()) != 0 {
		t.Fatalf("a column router: %v, %d sent", err, len(b.Messages()))
	}
}
