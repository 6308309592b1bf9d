package pgcdc

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

func row(agg string) outboxdriver.Row {
	return outboxdriver.Row{ID: agg, AggregateType: "t", AggregateID: agg}
}

// A position is confirmed only once every event before it is done, whatever order
// the events finish in (failure class 4: confirming too early).
func TestQueueConfirmsOnlyAfterEverythingBefore(t *testing.T) {
	t.Parallel()
	q := newQueue(100, 0)
	q.reached = 10
	q.push(&Change{Row: row("a")})
	q.push(&Change{Row: row("b")})
	q.mark(20) // commit of a, b
	q.push(&Change{Row: row("c")})
	q.mark(30)
	q.mark(35) // a keepalive between transactions: same checkpoint, later position
	now := time.Now()
	out, _ := q.take(10, 0, now, nil, nil)
	if len(out) != 3 {
		t.Fatalf("took %d", len(out))
	}
	q.done(out[2:]) // c first
	if got := q.confirmedLSN(); got != 10 {
		t.Fatalf("confirmed %d before a and b were done", got)
	}
	q.done(out[:1])
	if got := q.confirmedLSN(); got != 10 {
		t.Fatalf("confirmed %d with b not done", got)
	}
	q.done(out[1:2])
	if got := q.confirmedLSN(); got != 35 {
		t.Fatalf("confirmed %d, want 35", got)
	}
}

// A claim skipping an aggregate (a slow key's, in flight) takes none of its events;
// takeBack returns only the events still waiting, and what the position waits for
// stays open until they are done.
func TestQueueSkipsAggregatesInFlight(t *testing.T) {
	t.Parallel()
	q := newQueue(100, 0)
	for _, a := range []string{"slow", "x", "slow", "y"} {
		q.push(&Change{Row: row(a)})
	}
	q.mark(40)
	now := time.Now()
	all, _ := q.take(10, 0, now, nil, nil)
	q.done([]*entry{all[1], all[3]})
	q.giveBack([]*entry{all[0], all[2]}) // left out of a claim completed in parts
	skip := map[string]bool{outboxdriver.AggregateKey("t", "slow"): true}
	if got, _ := q.take(10, 0, now, skip, nil); len(got) != 0 {
		t.Fatalf("took %v skipping the slow aggregate, want nothing", idxs(got))
	}
	if got := q.takeBack([]*entry{all[0], all[1]}); len(got) != 1 || got[0] != all[0] {
		t.Fatalf("takeBack returned %v, want only the slow aggregate's first event, still waiting", idxs(got))
	}
	q.done([]*entry{all[0]})
	if got := q.confirmedLSN(); got != 0 {
		t.Fatalf("confirmed %d with the slow aggregate's second event waiting", got)
	}
	if got, _ := q.take(10, 0, now, nil, nil); len(got) != 1 || got[0] != all[2] {
		t.Fatalf("took %v, want the slow aggregate's second event", idxs(got))
	}
}

// A waiting (failed, retrying) event holds back the later events of its aggregate
// only; given-back events keep their order.
func TestQueueHoldsAggregateBehindWaitingEvent(t *testing.T) {
	t.Parallel()
	q := newQueue(100, 0)
	for _, a := range []string{"x", "y", "x", "y"} {
		r := row(a)
		q.push(&Change{Row: r})
	}
	now := time.Now()
	out, _ := q.take(10, 0, now, nil, nil)
	out[0].availableAt, out[0].failed = now.Add(time.Hour), true // x's first event failed: retry later
	q.giveBack(out[:1])
	q.done([]*entry{out[1]})
	q.giveBack(out[2:]) // the rest was a released prefetch
	got, _ := q.take(10, 0, now, nil, nil)
	if len(got) != 1 || got[0].idx != 3 {
		t.Fatalf("took %v, want only y's second event", idxs(got))
	}
	got, _ = q.take(10, 0, now.Add(2*time.Hour), nil, nil)
	if len(got) != 2 || got[0].idx != 0 || got[1].idx != 2 {
		t.Fatalf("after the retry time took %v, want x's two events in order", idxs(got))
	}
}

func TestQueueBoundsPending(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(2, 0)
		q.push(&Change{Row: row("a")})
		q.push(&Change{Row: row("b")})
		if q.waitSpace(time.Now().Add(20 * time.Millisecond)) {
			t.Fatal("space reported in a full queue")
		}
		out, _ := q.take(1, 0, time.Now(), nil, nil)
		go q.done(out)
		if !q.waitSpace(time.Now().Add(5 * time.Second)) {
			t.Fatal("no space after an event was done")
		}
	})
}

func idxs(es []*entry) []uint64 {
	var out []uint64
	for _, e := range es {
		out = append(out, e.idx)
	}
	return out
}

// TestQueueBoundsPendingBytes: the payload bytes waiting are bounded too, once more
// than minOpenEvents events are open (so a few huge events waiting for a retry never
// stop the stream), and a take stops at maxBytes.
func TestQueueBoundsPendingBytes(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(10_000, 1000)
		big := func(key string, n int) outboxdriver.Row {
			r := row(key)
			r.Payload = make([]byte, n)
			return r
		}
		q.push(&Change{Row: big("huge", 50_000)}) // far over the bound, stuck (never done here)
		for i := 1; i < minOpenEvents; i++ {
			if !q.waitSpace(time.Now()) {
				t.Fatalf("no space with %d events open behind one huge event: the stream would stall every aggregate", i)
			}
			q.push(&Change{Row: big(fmt.Sprint("k", i), 10)})
		}
		if q.waitSpace(time.Now().Add(20 * time.Millisecond)) {
			t.Fatal("space reported with 100 events and 50,990 of 1,000 bytes open")
		}
		out, held := q.take(10, 0, time.Now(), nil, func(key string) bool { return key == outboxdriver.AggregateKey("t", "huge") })
		if len(held) != 1 || len(out) != 9 {
			t.Fatalf("took %d and held %d; want the huge event held and 9 others", len(out), len(held))
		}
		q.giveBack(held) // still waiting
		go q.done(out)
		if !q.waitSpace(time.Now().Add(5 * time.Second)) {
			t.Fatal("no space after others' events were done")
		}
		q2 := newQueue(10_000, 500)
		q2.push(&Change{Row: big("a", 600)})
		q2.push(&Change{Row: big("b", 600)})
		if got, _ := q2.take(10, 500, time.Now(), nil, nil); len(got) != 1 {
			t.Fatalf("a take bounded to 500 bytes took %d events of 600, want the first alone", len(got))
		}
	})
}

// A delayed event (NotBefore) holds nothing back: its aggregate's later events pass
// it, and it is taken once due (outbox.Event.NotBefore's contract).
func TestQueueDelayedEventHoldsNothing(t *testing.T) {
	t.Parallel()
	q := newQueue(100, 0)
	now := time.Now()
	q.push(&Change{Row: row("x"), AvailableAt: now.Add(time.Hour)})
	q.push(&Change{Row: row("x")})
	got, _ := q.take(10, 0, now, nil, nil)
	if len(got) != 1 || got[0].idx != 1 {
		t.Fatalf("took %v, want x's second event past the delayed first", idxs(got))
	}
	q.done(got)
	if got, _ = q.take(10, 0, now.Add(2*time.Hour), nil, nil); len(got) != 1 || got[0].idx != 0 {
		t.Fatalf("once due took %v, want the delayed event", idxs(got))
	}
}

// Two tables on one ledger: the stream's position waits for the slower table, each
// table's own progress only for its own events (what a stream read again skips).
func TestSharedLedgerAndOwnProgress(t *testing.T) {
	t.Parallel()
	l := newLedger(100, 0, 0)
	fast, slow := newTableQueue(l), newTableQueue(l)
	slow.push(&Change{Row: row("s1"), Xid: 1, Inserted: true})
	slow.committed(10)
	l.mark(11)
	fast.push(&Change{Row: row("f1"), Xid: 2, Inserted: true})
	fast.push(&Change{Row: row("f2"), Xid: 2, Inserted: true})
	fast.committed(20)
	l.mark(21)
	fast.push(&Change{Row: row("f3"), Xid: 3, Inserted: true})
	fast.committed(30)
	l.mark(31)
	now := time.Now()
	out, _ := fast.take(10, 0, now, nil, nil)
	if len(out) != 3 {
		t.Fatalf("the fast table took %d of its 3 events", len(out))
	}
	fast.done(out[1:2]) // f2 alone: nothing of the fast table is whole yet
	if got := fast.ownDone(); got != 0 {
		t.Fatalf("fast table's progress %d with f1 not done", got)
	}
	fast.done(out[:1])
	if got := fast.ownDone(); got != 20 {
		t.Fatalf("fast table's progress %d, want 20", got)
	}
	fast.done(out[2:])
	if got, conf := fast.ownDone(), l.confirmedLSN(); got != 30 || conf != 0 {
		t.Fatalf("fast table's progress %d (want 30), stream confirmed %d (want 0: the slow table's event is not done)", got, conf)
	}
	if n := fast.openEvents() + slow.openEvents(); n != 1 {
		t.Fatalf("%d events open, want the slow table's one", n)
	}
	s, _ := slow.take(10, 0, now, nil, nil)
	slow.done(s)
	if got, conf := slow.ownDone(), l.confirmedLSN(); got != 10 || conf != 31 {
		t.Fatalf("slow table's progress %d (want 10), stream confirmed %d (want 31)", got, conf)
	}
	// A table let go: its events count as done, those claimed once given back.
	slow.push(&Change{Row: row("s2"), Xid: 4, Inserted: true})
	slow.push(&Change{Row: row("s3"), Xid: 4, Inserted: true})
	slow.committed(40)
	l.mark(41)
	claimed, _ := slow.take(1, 0, now, nil, nil)
	slow.drop()
	if conf := l.confirmedLSN(); conf != 31 {
		t.Fatalf("confirmed %d with a claimed event out", conf)
	}
	slow.giveBack(claimed)
	if conf := l.confirmedLSN(); conf != 41 {
		t.Fatalf("confirmed %d after the dropped table's claim came back, want 41", conf)
	}
}

// TestLedgerSpills: past the room, rows of a table are held without their payloads
// (up to maxSpilled) and every other event waits for room; done and parked events
// give back what they held, spilled or whole, and a spilled event given back drops
// the payload its claim read.
func TestLedgerSpills(t *testing.T) {
	t.Parallel()
	l := newLedger(2, 0, 2)
	big, quiet := newTableQueue(l), newTableQueue(l)
	withPayload := func(agg string) *Change {
		r := row(agg)
		r.Payload = []byte(`{"agg":"` + agg + `"}`)
		return &Change{Row: r, Inserted: true}
	}
	for _, a := range []string{"b1", "b2"} {
		if !big.push(withPayload(a)) {
			t.Fatalf("%s refused with room", a)
		}
	}
	if !l.canRead() || l.hasSpace() {
		t.Fatal("a full room with spill to spare must be read on, with no room for a whole event")
	}
	msg := withPayload("m")
	msg.Inserted = false // table-less: nothing to read it again from
	if big.push(msg) {
		t.Fatal("a table-less event was taken past the room")
	}
	if !big.push(withPayload("b3")) || !quiet.push(withPayload("q1")) {
		t.Fatal("rows refused with spill to spare")
	}
	if l.canRead() || big.push(withPayload("b4")) {
		t.Fatal("read on past maxSpilled")
	}
	got, _ := quiet.take(10, 0, time.Now(), nil, nil)
	if len(got) != 1 || !got[0].spilled || got[0].row.Payload != nil || got[0].size != len(`{"agg":"q1"}`) {
		t.Fatalf("the quiet table's event: %+v, want it spilled without its payload, its size kept", got)
	}
	got[0].row.Payload = []byte("read again")
	quiet.giveBack(got)
	got, _ = quiet.take(10, 0, time.Now(), nil, nil)
	if got[0].row.Payload != nil {
		t.Fatal("a spilled event given back kept the payload its claim read")
	}
	quiet.done(got)
	if !l.canRead() || l.hasSpace() {
		t.Fatal("a spilled event done must free spill, not room")
	}
	big.park(func() {})
	if !l.hasSpace() || l.spilled != 0 || l.open != 0 || l.openBytes != 0 {
		t.Fatalf("after parking the only open table: open %d, bytes %d, spilled %d; want all 0", l.open, l.openBytes, l.spilled)
	}
}

// TestStreamWaitsForRoomForWhatCannotSpill: an event that can be neither held whole
// nor spilled (a table-less one) waits, read, until there is room, and nothing more
// is read meanwhile; if its table is parked while it waits, it is dropped (the
// stream is read again for that table once it caught up).
func TestStreamWaitsForRoomForWhatCannotSpill(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := newLedger(1, 0, 5)
		s := &stream{l: l}
		rows, msgs := newTableQueue(l), newTableQueue(l)
		if !rows.push(&Change{Row: row("r1"), Inserted: true}) {
			t.Fatal("refused with room")
		}
		m1 := &Change{Row: row("m1")}
		if msgs.push(m1) {
			t.Fatal("a table-less event taken past a full room")
		}
		s.unqueued, s.unqueuedTo = m1, msgs
		if s.ready(time.Now().Add(20 * time.Millisecond)) {
			t.Fatal("read on while an event waits for room")
		}
		out, _ := rows.take(10, 0, time.Now(), nil, nil)
		go rows.done(out)
		if !s.ready(time.Now().Add(5*time.Second)) || s.unqueued != nil {
			t.Fatal("the waiting event was not queued once there was room")
		}
		if got, _ := msgs.take(10, 0, time.Now(), nil, nil); len(got) != 1 || got[0].spilled {
			t.Fatalf("took %+v, want the table-less event, whole", got)
		}

		m2 := &Change{Row: row("m2")}
		if msgs.push(m2) {
			t.Fatal("a table-less event taken past a full room")
		}
		s.unqueued, s.unqueuedTo = m2, msgs
		msgs.park(func() {})
		if !s.ready(time.Now()) || s.unqueued != nil {
			t.Fatal("an event of a table parked while it waited still holds the stream")
		}
		if n := msgs.openEvents(); n != 1 || l.open != 0 {
			t.Fatalf("the parked table has %d open events (want 1: m1, taken) and the room %d (want 0): m2 was queued into a parked table", n, l.open)
		}
	})
}
