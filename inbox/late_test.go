package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/inbox"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
	"github.com/outboxd/outbox/relay/relaytest"
)

// TestVersionGuardTakesLateEvents: the relay rightly publishes two kinds of event
// after later events of their aggregate: a delayed one (Event.NotBefore) passed by
// the next event, and a dead letter replayed after its aggregate flowed past it
// (FlowPastDeadLetters). Both arrive marked outbox-late, and a consumer with the
// version guard processes them instead of skipping them as stale, while the guard
// still skips a real redelivery of an older event.
func TestVersionGuardTakesLateEvents(t *testing.T) {
	t.Parallel()
	pool, drv := testenv.Outbox(t)
	store, err := drv.Store()
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := memory.New(0)
	relaytest.Start(t, store, b, &relay.Config{FlowPastDeadLetters: true, PollInterval: 20 * time.Millisecond})
	ctx := context.Background()
	write := func(ev outbox.Event) string {
		t.Helper()
		if err := w.Write(ctx, ev); err != nil {
			t.Fatal(err)
		}
		return ev.ID
	}

	// A delayed event, passed by the next one.
	delayed := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: "a", Type: "Reminder", Payload: []byte(`{}`), NotBefore: time.Now().Add(time.Second)}
	write(delayed)
	next := write(outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: "a", Type: "Shipped", Payload: []byte(`{}`)})
	// A dead letter (refused for good), passed by its aggregate's next event, then
	// replayed once the cause is fixed.
	b.Refuse("b", true)
	dead := write(outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: "b", Type: "Placed", Payload: []byte(`{}`)})
	testenv.Wait(t, ctx, "the refused event in the dead letters", func() bool {
		e, err := store.Event(ctx, dead)
		return err == nil && e.State == outboxdriver.EventDead
	})
	b.RefuseNone("b")
	after := write(outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: "b", Type: "Paid", Payload: []byte(`{}`)})
	testenv.Wait(t, ctx, "the dead letter's successor published", func() bool { return published(b, after) != nil })
	if n, err := store.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: []string{dead}}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	testenv.Wait(t, ctx, "every event published", func() bool {
		return published(b, delayed.ID) != nil && published(b, next) != nil && published(b, dead) != nil
	})

	ib, err := inbox.NewPgx(pool, &inbox.Config{Table: testenv.UniqueName("inbox_"), VersionGuard: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	handle := func(m *broker.Message) inbox.Outcome {
		t.Helper()
		msg := &inbox.Message{ID: m.ID, AggregateType: m.AggregateType, AggregateID: m.AggregateID, Seq: m.Seq, Headers: m.Headers}
		o, err := ib.Handle(ctx, "readmodel", msg, func(context.Context, pgx.Tx) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	for _, want := range []struct {
		id, late string
	}{{next, ""}, {delayed.ID, "delayed"}, {after, ""}, {dead, "replayed"}} {
		m := published(b, want.id)
		if got := m.Headers[broker.HeaderLate]; got != want.late {
			t.Fatalf("event %s (%s): outbox-late %q, want %q", m.ID, m.EventType, got, want.late)
		}
		if o := handle(m); o != inbox.Processed {
			t.Fatalf("event %s (%s, seq %d) in arrival order: %v, want processed", m.ID, m.EventType, m.Seq, o)
		}
	}
	// The guard still guards: a redelivery of an older unmarked event is stale.
	old := *published(b, after)
	old.ID, old.Seq = uuid.Must(uuid.NewV7()).String(), old.Seq-1
	if o := handle(&old); o != inbox.Stale {
		t.Fatalf("an older unmarked event after the late ones: %v, want stale", o)
	}
	// Neither decision is silent: both are counted (and logged).
	if got, want := ib.GuardStats(), (inbox.GuardStats{Stale: 1, Late: 2}); got != want {
		t.Fatalf("guard stats %+v, want %+v", got, want)
	}
}

// published is the message of event id the broker holds (nil: none yet).
func published(b *memory.Broker, id string) *broker.Message {
	for _, m := range b.Messages() {
		if m.ID == id {
			return &m
		}
	}
	return nil
}
