package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"pgregory.net/rapid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/outboxmysql"
	"github.com/outboxd/outbox/outboxdriver/outboxsqlite"
	"github.com/outboxd/outbox/relay"
)

// The generated fault suite, on PostgreSQL, MariaDB and SQLite: rapid makes a backlog (aggregates, events, payloads over
// the broker's limit among them) and a broker's behaviour, publish call by publish
// call (answer, be down, take and never answer, answer after the deadline, refuse a
// message, close the connection mid-batch); the real relay relays the backlog from the
// real PostgreSQL through it. Then
// the faults stop. Invariants:
//   - every good event is delivered, in write order per aggregate (first deliveries),
//     within faultDeadline of the faults stopping;
//   - every bad event is dead, with its reason;
//   - an event is delivered again only after an acknowledgement was lost: resends are
//     at most the messages the broker took in calls whose answer was lost;
//   - the relay never stops and never panics.
//
// CI runs faultChecksDefault cases; OUTBOX_FAULT_CHECKS=N (or -rapid.checks=N) runs
// more. A failing case is shrunk, and rapid saves it under testdata/rapid/ to replay
// with -rapid.failfile; keep it there as a regression case (docs/testing.md).

const (
	faultChecksDefault = 30
	faultDeadline      = 30 * time.Second
	faultMaxBytes      = 512 // the broker's limit: bad events are larger
)

// fault is what the broker does with one publish call.
type fault int

const (
	answer      fault = iota // every message answered as the broker would
	down                     // nothing taken: the connection's failure
	lostAck                  // every message taken, no answer comes
	late                     // every message taken, the answers come after the deadline
	refuseFirst              // the call's first message refused (a retry), the rest answered
	cut                      // the connection closes after half the call's messages
	slowLast                 // the call's last message is answered late, but in time: a straggler
)

var faults = []fault{answer, down, lostAck, late, refuseFirst, cut, slowLast}

func (f fault) String() string {
	return [...]string{"answer", "down", "lost-ack", "late", "refuse-first", "cut", "slow-last"}[f]
}

// faultAckTimeout is the faulty broker's deadline for an answer; faultSlow how late
// a slow answer comes, and faultStraggler the relay's StragglerAfter, so a slow
// answer makes a straggler (a busy machine may make it late instead: it counts as
// possibly lost).
const (
	faultAckTimeout = 20 * time.Millisecond
	faultSlow       = 12 * time.Millisecond
	faultStraggler  = 3 * time.Millisecond
)

// faulty is a broker that misbehaves as its script says, one entry per publish call,
// then behaves. It decides through broker.Sequence, as every publisher does, and
// keeps what it takes in the memory broker (which passes brokertest).
type faulty struct {
	mem *memory.Broker

	mu       sync.Mutex
	script   []fault
	lostSent int      // messages taken whose answer never came in time
	story    []string // each call: its fault and each message's fate, told on failure
}

func (f *faulty) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	f.mu.Lock()
	now := answer
	if len(f.script) > 0 {
		now, f.script = f.script[0], f.script[1:]
	}
	f.mu.Unlock()
	res := f.sequence(ctx, now, msgs)
	line := now.String() + ":"
	for i := range msgs {
		line += fmt.Sprintf(" %s/%s=%v", msgs[i].Key, msgs[i].ID[len(msgs[i].ID)-4:], res[i].Err)
	}
	f.mu.Lock()
	f.story = append(f.story, line)
	f.mu.Unlock()
	return res
}

func (f *faulty) sequence(ctx context.Context, now fault, msgs []broker.Message) []broker.Result {
	return broker.Sequence(ctx, msgs, broker.Schedule{AckTimeout: faultAckTimeout}, broker.Sender{
		Prepare: func(_ context.Context, i int) error {
			switch {
			case now == down:
				return broker.Unavailable(errors.New("faulty: down"))
			case now == cut && i >= len(msgs)/2:
				return broker.Unavailable(errors.New("faulty: the connection closed"))
			case now == refuseFirst && i == 0:
				return errors.New("faulty: refused, try again")
			case len(msgs[i].Payload) > faultMaxBytes:
				return broker.Permanent(fmt.Errorf("payload of %d bytes exceeds the limit of %d", len(msgs[i].Payload), faultMaxBytes))
			}
			return nil
		},
		Send: func(ctx context.Context, i int) (broker.Future, error) {
			if err := f.mem.Publish(ctx, msgs[i:i+1])[0].Err; err != nil {
				return nil, err
			}
			switch {
			case now == lostAck, now == late:
				f.mu.Lock()
				f.lostSent++
				f.mu.Unlock()
				return noAnswer{}, nil
			case now == slowLast && i == len(msgs)-1:
				f.mu.Lock()
				f.lostSent++
				f.mu.Unlock()
				return slowAnswer{at: time.Now().Add(faultSlow)}, nil
			}
			return broker.Answered{}, nil
		},
	})
}

// tell is the story of a failed case: each publish call, then the relay's warnings.
func (f *faulty) tell(logs *testenv.Buffer) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "calls:\n" + strings.Join(f.story, "\n") + "\nrelay:\n" + logs.String()
}

// noAnswer is an answer that comes only after the deadline (or never).
type noAnswer struct{}

func (noAnswer) Wait(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

// slowAnswer is an acknowledgement that comes at a given time.
type slowAnswer struct{ at time.Time }

func (a slowAnswer) Wait(ctx context.Context) error {
	t := time.NewTimer(time.Until(a.at))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *faulty) Features() broker.Features { return f.mem.Features() }
func (f *faulty) Close() error              { return f.mem.Close() }

func (f *faulty) faultsLeft() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.script)
}

// faultChecks sets rapid's number of cases, unless the command line did.
func faultChecks() {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if set {
		return
	}
	n := os.Getenv("OUTBOX_FAULT_CHECKS")
	if n == "" {
		n = fmt.Sprint(faultChecksDefault)
	}
	_ = flag.Set("rapid.checks", n)
}

// faultStore is one database's outbox for the fault suite: one table for every case,
// emptied before each.
type faultStore struct {
	store outboxdriver.Store
	write func(ctx context.Context, evs ...outbox.Event) error
	empty func(ctx context.Context) error
}

func TestGeneratedFaults(t *testing.T) {
	faultChecks()
	t.Run("postgres", func(t *testing.T) {
		e := setupB(t)
		generatedFaults(t, faultStore{store: e.store, write: e.w.Write, empty: func(ctx context.Context) error {
			_, err := e.pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{e.table.Schema, e.table.Name}.Sanitize()+", "+
				pgx.Identifier{e.table.Schema, e.table.Name + "_dead"}.Sanitize())
			return err
		}})
	})
	t.Run("mariadb", func(t *testing.T) {
		db, name := testenv.MariaDB(t, "outbox_")
		generatedFaults(t, sqlFaultStore(t, outboxmysql.New(db, &outboxdriver.Table{Name: name}), func(ctx context.Context) error {
			for _, tbl := range []string{name, name + "_dead"} {
				if _, err := db.ExecContext(ctx, "DELETE FROM `"+tbl+"`"); err != nil {
					return err
				}
			}
			return nil
		}))
	})
	t.Run("sqlite", func(t *testing.T) {
		db, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		generatedFaults(t, sqlFaultStore(t, outboxsqlite.New(db, nil), func(ctx context.Context) error {
			_, err := db.ExecContext(ctx, "DELETE FROM outbox; DELETE FROM outbox_dead")
			return err
		}))
	})
}

// sqlFaultStore migrates a database/sql driver's table and writes through it.
func sqlFaultStore(t *testing.T, drv outboxdriver.Driver[*sql.Tx], empty func(context.Context) error) faultStore {
	t.Helper()
	m, err := drv.Migrator()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	return faultStore{store: store, write: w.Write, empty: empty}
}

func generatedFaults(t *testing.T, e faultStore) {
	t.Helper()
	rapid.Check(t, func(rt *rapid.T) {
		aggs := rapid.IntRange(1, 6).Draw(rt, "aggregates")
		type ev struct {
			agg string
			bad bool
		}
		evs := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) ev {
			return ev{agg: fmt.Sprint("a", rapid.IntRange(0, aggs-1).Draw(rt, "agg")), bad: rapid.IntRange(0, 9).Draw(rt, "badness") == 0}
		}), 1, 60).Draw(rt, "events")
		script := rapid.SliceOfN(rapid.SampledFrom(faults), 0, 12).Draw(rt, "faults")
		batch := rapid.IntRange(1, 20).Draw(rt, "batch size")

		if err := e.empty(context.Background()); err != nil {
			rt.Fatal(err)
		}
		f := &faulty{mem: memory.New(0), script: script}
		logs := &testenv.Buffer{} // the relay's warnings, told on failure
		r, err := relay.New(e.store, f, &relay.Config{
			BatchSize: batch, PollInterval: 10 * time.Millisecond, FlowPastDeadLetters: true,
			MaxAttempts: 1000, RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond,
			BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond, StragglerAfter: faultStraggler,
			Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			rt.Fatal(err)
		}
		written := make([]outbox.Event, len(evs))
		bad := map[string]bool{}
		for i, x := range evs {
			payload := []byte(fmt.Sprintf(`{"i":%d}`, i))
			if x.bad {
				payload = []byte(`{"pad":"` + strings.Repeat("x", faultMaxBytes) + `"}`)
			}
			written[i] = outbox.Event{AggregateType: "order", AggregateID: x.agg, Type: "T", Payload: payload}
		}
		ctx, cancel := context.WithTimeout(context.Background(), faultDeadline+10*time.Second)
		defer cancel()
		if err := e.write(ctx, written...); err != nil {
			rt.Fatal(err)
		}
		for i, x := range evs {
			if x.bad {
				bad[written[i].ID] = true
			}
		}
		runCtx, stopRun := context.WithCancel(ctx)
		runErr := make(chan error, 1)
		go func() { runErr <- r.Run(runCtx) }()
		defer func() {
			stopRun()
			if err := <-runErr; err != nil {
				rt.Errorf("the relay stopped with %v", err)
			}
		}()

		settled := func() bool {
			st, err := e.store.Status(ctx)
			if err != nil {
				rt.Fatal(err)
			}
			return st.Unpublished == 0 && int(st.Dead) == len(bad)
		}
		// The faults last until the script is played out, or the relay settled the
		// backlog before it was (then the rest of the script is dropped).
		deadline := time.Now().Add(faultDeadline)
		for f.faultsLeft() > 0 && !settled() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) //nolint:forbidigo // polls inside a rapid check, whose T is no testing.TB for testenv.Wait
		}
		f.mu.Lock()
		f.script = nil
		f.mu.Unlock()
		deadline = time.Now().Add(faultDeadline) // the faults stopped: the bound counts from here
		for !settled() {
			select {
			case err := <-runErr:
				runErr <- err
				rt.Fatalf("the relay stopped: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				st, _ := e.store.Status(ctx)
				rt.Fatalf("%v after the faults stopped: %+v, %d bad (script %v)", faultDeadline, st, len(bad), script)
			}
			time.Sleep(10 * time.Millisecond) //nolint:forbidigo // polls inside a rapid check, whose T is no testing.TB for testenv.Wait
		}

		// Delivered: each good event once at least, first deliveries in write order.
		pos := map[string]int{}
		for i, w := range written {
			pos[w.ID] = i
		}
		last := map[string]int{}
		seen := map[string]bool{}
		for _, m := range f.mem.Messages() {
			if bad[m.ID] {
				rt.Fatalf("bad event %s was delivered", m.ID)
			}
			if p, ok := last[m.Key]; ok && pos[m.ID] < p {
				var ids []string
				for _, w := range written {
					ids = append(ids, w.AggregateID+"/"+w.ID[len(w.ID)-4:])
				}
				rt.Fatalf("aggregate %s: event %d delivered after %d\nevents: %v\n%s", m.Key, pos[m.ID], p, ids, f.tell(logs))
			}
			last[m.Key], seen[m.ID] = pos[m.ID], true
		}
		if want := len(written) - len(bad); len(seen) != want {
			rt.Fatalf("delivered %d good events, want %d", len(seen), want)
		}
		// Dead: each bad event, with its reason.
		dead, err := e.store.ListDead(ctx, nil)
		if err != nil {
			rt.Fatal(err)
		}
		for _, d := range dead {
			if !bad[d.ID] || !strings.Contains(d.Error, "exceeds the limit") {
				rt.Fatalf("dead letter %s (bad: %v): %q", d.ID, bad[d.ID], d.Error)
			}
		}
		// Resent: only what a lost answer makes the relay send again.
		f.mu.Lock()
		lost := f.lostSent
		f.mu.Unlock()
		if dups := f.mem.Duplicates(); dups > lost {
			rt.Fatalf("%d events delivered again, but only %d answers were lost\n%s", dups, lost, f.tell(logs))
		}
	})
}
