package relay_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker/webhook"
	"github.com/outboxd/outbox/broker/webhook/webhooktest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/relay"
)

// TestSlowEndpointOutlivesTheClaimHold: a receiver that holds one key's answers longer
// than the claim's hold (the leadership bound, which is also the claim transaction's
// idle limit) used to have PostgreSQL end the claim while its batch was out; nothing
// was marked and the batch went out again and again. Now the claim is kept alive
// while its batch is out, and what the broker acknowledged is marked even if the claim
// ended: every event is delivered exactly once, in order per key. Batches of four fill
// up, so the next claim runs while the slow batch is out.
func TestSlowEndpointOutlivesTheClaimHold(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := &webhooktest.Receiver{HoldKey: "slow", Hold: 2500 * time.Millisecond}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	pub, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: "s3cret", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, e, pub, &relay.Config{BatchSize: 4, LeaderTimeout: time.Second, PollInterval: 20 * time.Millisecond})
	ctx := waitCtx(t)

	want := map[string][]string{}
	var evs []outbox.Event
	for i := 0; i < 3; i++ {
		for _, key := range []string{"slow", "a", "b", "c"} {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: key, Type: "T", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
		}
	}
	if err := e.w.Write(ctx, evs...); err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		want[ev.AggregateID] = append(want[ev.AggregateID], ev.ID)
	}
	testenv.Wait(t, ctx, "every event marked published", func() bool {
		st, err := e.store.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Unpublished == 0
	})
	if p := r.Stats().Published; p != int64(len(evs)) {
		t.Errorf("the broker acknowledged %d messages, want %d (one per event)", p, len(evs))
	}
	count, order := rc.Snapshot()
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s delivered %d times, want once", id, n)
		}
	}
	for key, ids := range want {
		if fmt.Sprint(order[key]) != fmt.Sprint(ids) {
			t.Errorf("key %s delivered as %v, want %v", key, order[key], ids)
		}
	}
}

// TestSlowKeyHoldsOnlyItself: a receiver holds one aggregate's answer until the test
// lets it go. Before, the whole batch waited for it, and so did every aggregate
// written after. Now the batch's other aggregates are marked as soon as they are
// answered, later events of other aggregates flow, and the slow aggregate's later
// events wait behind it: all of that while its answer is still held. Once answered,
// it is marked without being sent again, and its aggregate goes on in order.
//
// StragglerAfter is the default (500 ms), far above the other aggregates' answers even
// on a loaded machine: a batch cut before any answer came lands whole, with its
// slowest aggregate (docs/architecture.md), and would hold them all.
func TestSlowKeyHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rc := &webhooktest.Receiver{HoldKey: "slow"}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	defer rc.Open()
	pub, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: "s3cret", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	r := startRelay(t, e, pub, &relay.Config{BatchSize: 10, PollInterval: 20 * time.Millisecond, StragglerAfter: relay.StragglerAfterDefault})
	ctx := waitCtx(t)

	write := func(keys ...string) []outbox.Event {
		var evs []outbox.Event
		for _, key := range keys {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: key, Type: "T", Payload: []byte(`{}`)})
		}
		if err := e.w.Write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		return evs
	}
	published := func(evs []outbox.Event) bool {
		for _, ev := range evs {
			info, err := e.store.Event(ctx, ev.ID)
			if err != nil {
				t.Fatal(err)
			}
			if info.State != "published" {
				return false
			}
		}
		return true
	}
	first := write("slow", "a", "b", "c")
	testenv.Wait(t, ctx, "the batch's other aggregates marked while the slow one is held", func() bool { return published(first[1:]) })
	second := write("a", "slow", "d", "b")
	testenv.Wait(t, ctx, "later events of other aggregates published while the slow one is held", func() bool {
		return published([]outbox.Event{second[0], second[2], second[3]})
	})
	count, _ := rc.Snapshot()
	if n := count[first[0].ID]; n != 1 {
		t.Fatalf("the held event was sent %d times while held, want once", n)
	}
	if n := count[second[1].ID]; n != 0 {
		t.Fatalf("the slow aggregate's next event went out before the held one was answered (%d times)", n)
	}

	rc.Open()
	testenv.Wait(t, ctx, "the slow aggregate published once answered", func() bool { return published([]outbox.Event{first[0], second[1]}) })
	count, order := rc.Snapshot()
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s delivered %d times, want once", id, n)
		}
	}
	if got, want := order["slow"], []string{first[0].ID, second[1].ID}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the slow aggregate delivered as %v, want %v", got, want)
	}
	if p := r.Stats().Published; p != 8 {
		t.Errorf("the broker acknowledged %d messages, want 8", p)
	}
}
