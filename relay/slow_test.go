package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/broker/memory"
	"github.com/outboxd/outbox/broker/webhook/webhooktest"
	"github.com/outboxd/outbox/internal/testenv"
	"github.com/outboxd/outbox/outboxdriver"
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
	pub := rc.Publisher(t, 5*time.Second)
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
	defer rc.Open()
	pub := rc.Publisher(t, time.Minute)
	r := startRelay(t, e, pub, &relay.Config{BatchSize: 10, PollInterval: 20 * time.Millisecond, StragglerAfter: relay.StragglerAfterDefault})
	ctx := waitCtx(t)

	slowKey(t, ctx, e, "slow", nil).Run(t, ctx, rc)
	if p := r.Stats().Published; p != 8 {
		t.Errorf("the broker acknowledged %d messages, want 8", p)
	}
}

// TestSlowKeyInAGroupKeepsItsPartition: in a group, too, a batch is split around a
// slow key, and the member whose straggler is out keeps that row's partition past its
// share until the straggler is settled. A member that joins meanwhile takes the rest
// of its share but not that partition: its claims would take the held event's row
// (unlocked, unpublished) and send it again while the first copy is still out.
func TestSlowKeyInAGroupKeepsItsPartition(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := waitCtx(t)
	parts := e.table.Partitions
	member := func(id string, pub broker.Publisher) *relay.Relay {
		return startRelay(t, e, pub, &relay.Config{BatchSize: 10, PollInterval: 20 * time.Millisecond,
			StragglerAfter: relay.StragglerAfterDefault, Group: &relay.GroupConfig{RelayID: id, LeaseTTL: 2 * time.Second}})
	}

	// The slow key is one whose partition falls in b's share beside a's (a share
	// depends only on the members' ids): learnt from a first run of the two with
	// nothing to publish, and the partition column of rows inserted and rolled back.
	a, b := member("a", memory.New(0)), member("b", memory.New(0))
	testenv.Wait(t, ctx, "both members owning their shares", func() bool {
		return a.Stats().Partitions == parts/2 && b.Stats().Partitions == parts/2
	})
	slow := keyInShareOf(t, ctx, e, "b")
	for _, r := range []*relay.Relay{a, b} {
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}

	rc := &webhooktest.Receiver{HoldKey: slow}
	defer rc.Open()
	pub := rc.Publisher(t, time.Minute)
	a = member("a", pub)
	testenv.Wait(t, ctx, "the first member owning every partition", func() bool { return a.Stats().Partitions == parts })
	slowKey(t, ctx, e, slow, func() {
		b = member("b", pub)
		testenv.Wait(t, ctx, "the second member owning its share but the slow key's partition", func() bool {
			return b.Stats().Partitions == parts/2-1 && a.Stats().Partitions == parts/2+1
		})
	}).Run(t, ctx, rc)
	testenv.Wait(t, ctx, "the slow key's partition handed over once settled", func() bool {
		return a.Stats().Partitions == parts/2 && b.Stats().Partitions == parts/2
	})
}

// keyInShareOf returns an aggregate id (of type "order") whose partition the group
// member id holds now, read from the partition column of rows inserted and rolled back.
func keyInShareOf(t *testing.T, ctx context.Context, e *env, id string) string {
	t.Helper()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	table := pgx.Identifier{e.table.Schema, e.table.Name}.Sanitize()
	leases := pgx.Identifier{e.table.Schema, e.table.Derived("_leases")}.Sanitize()
	var key string
	err = tx.QueryRow(ctx, `WITH probe AS (
  INSERT INTO `+table+` (aggregatetype, aggregateid, type, payload)
  SELECT 'order', 'slow-' || i, 'T', '{}' FROM generate_series(1, 1000) AS i
  RETURNING aggregateid, partition, seq)
SELECT aggregateid FROM probe WHERE partition IN (SELECT partition FROM `+leases+` WHERE owner = $1)
ORDER BY seq LIMIT 1`, id).Scan(&key)
	if err != nil {
		t.Fatalf("an aggregate in %s's share: %v", id, err)
	}
	return key
}

// slowKey is the slow-key scenario on e's table: done is marked published.
func slowKey(t *testing.T, ctx context.Context, e *env, key string, held func()) *webhooktest.SlowKey {
	t.Helper()
	return &webhooktest.SlowKey{Key: key, Writer: e.w, Held: held, Done: func(ids ...string) bool {
		for _, id := range ids {
			info, err := e.store.Event(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if info.State != outboxdriver.EventPublished {
				return false
			}
		}
		return true
	}}
}
