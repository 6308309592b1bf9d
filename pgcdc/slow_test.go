package pgcdc_test

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
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/relay"
)

// TestSlowKeyHoldsOnlyItself: in CDC mode too, a receiver that holds one aggregate's
// answer holds only that aggregate. Before, the CDC source could not complete a batch
// in parts, so the whole batch waited for the slow answer, and so did every event
// streamed after it. Now the batch's other aggregates are done as soon as they are
// answered, later events of other aggregates flow, and the slow aggregate's later
// events wait behind it, all while its answer is held; once answered it is done
// without being sent again, and its aggregate goes on in order. In rows mode the
// rows are marked published as they are answered.
func TestSlowKeyHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	for _, mode := range []outboxdriver.WriteMode{outboxdriver.WriteRows, outboxdriver.WriteMessage} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			slowKeyHoldsOnlyItself(t, mode)
		})
	}
}

func slowKeyHoldsOnlyItself(t *testing.T, mode outboxdriver.WriteMode) {
	t.Helper()
	e := setup(t, mode)
	rc := &webhooktest.Receiver{HoldKey: "slow"}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	defer rc.Open()
	pub, err := webhook.Dial(context.Background(), srv.URL, &webhook.Config{Secret: "s3cret", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// StragglerAfter is the default, far above the other aggregates' answers even on
	// a loaded machine.
	r := e.startRelay(t, e.source(t, nil), pub, &relay.Config{BatchSize: 10, StragglerAfter: relay.StragglerAfterDefault})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, err := outbox.NewWriter(e.drv, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := e.admin(t)
	write := func(keys ...string) []string {
		t.Helper()
		var evs []outbox.Event
		for _, key := range keys {
			evs = append(evs, outbox.Event{AggregateType: "order", AggregateID: key, Type: "T", Payload: []byte(`{}`)})
		}
		if err := w.Write(ctx, evs...); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, len(evs))
		for i := range evs {
			ids[i] = evs[i].ID
		}
		return ids
	}
	// done: each id delivered and, in rows mode, its row marked published.
	done := func(ids ...string) bool {
		t.Helper()
		count, _ := rc.Snapshot()
		for _, id := range ids {
			if count[id] == 0 {
				return false
			}
			if mode != outboxdriver.WriteRows {
				continue
			}
			info, err := admin.Event(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if info.State != outboxdriver.EventPublished {
				return false
			}
		}
		return true
	}

	first := write("slow", "a", "b", "c")
	testenv.Wait(t, ctx, "the batch's other aggregates done while the slow one is held", func() bool { return done(first[1:]...) })
	second := write("a", "slow", "d", "b")
	testenv.Wait(t, ctx, "later events of other aggregates done while the slow one is held", func() bool {
		return done(second[0], second[2], second[3])
	})
	count, _ := rc.Snapshot()
	if n := count[first[0]]; n != 1 {
		t.Fatalf("the held event was sent %d times while held, want once", n)
	}
	if n := count[second[1]]; n != 0 {
		t.Fatalf("the slow aggregate's next event went out before the held one was answered (%d times)", n)
	}

	rc.Open()
	testenv.Wait(t, ctx, "the slow aggregate done once answered", func() bool { return done(first[0], second[1]) })
	if mode == outboxdriver.WriteRows {
		testenv.Wait(t, ctx, "no row left unpublished", func() bool {
			st, err := admin.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return st.Unpublished == 0
		})
	}
	testenv.Wait(t, ctx, "the relay counted every answer", func() bool { return r.Stats().Published >= 8 })
	count, order := rc.Snapshot()
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s delivered %d times, want once", id, n)
		}
	}
	if got, want := order["slow"], []string{first[0], second[1]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the slow aggregate delivered as %v, want %v", got, want)
	}
	if p := r.Stats().Published; p != 8 {
		t.Errorf("the broker acknowledged %d messages, want 8", p)
	}
}
