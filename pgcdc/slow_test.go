package pgcdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxd/outbox"
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
	defer rc.Open()
	pub := rc.Publisher(t, time.Minute)
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
	// Done: delivered and, in rows mode, marked published.
	done := func(ids ...string) bool {
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
	(&webhooktest.SlowKey{Key: "slow", Writer: w, Done: done}).Run(t, ctx, rc)
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
	if p := r.Stats().Published; p != 8 {
		t.Errorf("the broker acknowledged %d messages, want 8", p)
	}
}
