package outboxdrivertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

func testFailures[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := source(t, h)
	all := writeCommitted(t, h, event("a", 1), event("b", 1))
	for i := 0; i < 3; i++ {
		c := claimN(t, s, 2, &outboxdriver.ClaimParams{Limit: 10})
		if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{
			{ID: all[0], Error: "refused", CountAttempt: true},
			{ID: all[1], Error: "broker down", CountAttempt: false},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	rows := drainN(t, s, 2)
	if len(rows) != 2 || rows[0].Attempts != 3 || rows[1].Attempts != 0 {
		t.Fatalf("attempts = %+v, want 3 for the refused event and 0 for the unavailable broker", rows)
	}
}

func testFailingBlocks[TTx any](t *testing.T, h *Harness[TTx]) {
	s := source(t, h)
	k := writeCommitted(t, h, event("k", 1), event("k", 2), event("k", 3))
	late := writeCommitted(t, h, event("late", 1), event("late", 2))
	other := writeCommitted(t, h, event("other", 1))
	c := claimN(t, s, 6, nil)
	if len(c.Rows()) != 6 {
		t.Fatalf("claimed %d rows, want 6", len(c.Rows()))
	}
	// k's first event is refused and due again at once; late's first is refused and
	// due in an hour. Their later events were held back by the broker.
	complete(t, c, &outboxdriver.CompleteParams{Published: other, Failed: []outboxdriver.Failure{
		{ID: k[0], Error: "refused", CountAttempt: true, RetryAt: time.Now().Add(-time.Millisecond)},
		{ID: k[1], Error: "held back"}, {ID: k[2], Error: "held back"},
		{ID: late[0], Error: "refused", CountAttempt: true, RetryAt: time.Now().Add(time.Hour)},
		{ID: late[1], Error: "held back"},
	}})
	c = claimN(t, s, 1, nil)
	got := ids(c.Rows())
	if len(got) == 0 || got[0] != k[0] || c.Rows()[0].Attempts != 1 {
		t.Fatalf("claimed %v; want the failing event %s first, with 1 attempt", c.Rows(), k[0])
	}
	if s.stream && len(got) == len(k) {
		// A stream hands the retried event out with its aggregate's later ones, in
		// order (the relay holds those back if it fails again); late's stay waiting.
		if fmt.Sprint(got) != fmt.Sprint(k) {
			t.Fatalf("claimed %v; want %v, the failing event first", got, k)
		}
		complete(t, c, &outboxdriver.CompleteParams{Published: got})
		quiet(t, s)
		return
	}
	if fmt.Sprint(got) != fmt.Sprint(k[:1]) {
		t.Fatalf("claimed %v; want only the failing event %s, retried alone", got, k[0])
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: k[:1]})
	if got := ids(drainN(t, s, 2)); fmt.Sprint(got) != fmt.Sprint(k[1:]) {
		t.Fatalf("after the retry succeeded: %v, want %v", got, k[1:])
	}
	if s.stream {
		return // the stream's backlog is not the table's status
	}
	st, _ := s.admin.Status(ctxT(t))
	if st.Unpublished != 2 || st.Failing != 1 {
		t.Fatalf("status = %+v, want late's two events waiting, one failing", st)
	}
}

// testDeadLetterReplay: a dead letter that holds its aggregate keeps the aggregate's
// later events back (the table store leaves them in the table; the CDC source moves
// them to the dead letters behind it) while other aggregates flow; replaying it
// publishes them all, in order.
func testDeadLetterReplay[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := source(t, h)
	k := writeCommitted(t, h, event("k", 1), event("k", 2))
	other := writeCommitted(t, h, event("other", 1))
	c := claimN(t, s, 3, nil)
	complete(t, c, &outboxdriver.CompleteParams{Published: other, Failed: []outboxdriver.Failure{
		{ID: k[0], Error: "too large", CountAttempt: true, Dead: true, HoldKey: true},
		{ID: k[1], Error: "held back"},
	}})
	more := writeCommitted(t, h, event("k", 3), event("other", 2))
	if got := ids(drainN(t, s, 1)); fmt.Sprint(got) != fmt.Sprint(more[1:]) {
		t.Fatalf("while k is quarantined got %v, want only %v", got, more[1:])
	}
	dead, err := s.admin.ListDead(ctx, &outboxdriver.DeadFilter{AggregateID: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) == 0 || dead[0].ID != k[0] || dead[0].Error != "too large" || dead[0].Attempts != 1 || !dead[0].HoldsKey ||
		string(dead[0].Payload) != `{"n": 1}` {
		t.Fatalf("dead letters = %+v", dead)
	}
	if !s.stream {
		st, _ := s.admin.Status(ctx)
		if len(dead) != 1 || st.Dead != 1 || st.HeldKeys != 1 {
			t.Fatalf("status = %+v, want 1 dead letter holding 1 key", st)
		}
	}
	if n, err := s.admin.ReplayDead(ctx, &outboxdriver.DeadFilter{AggregateType: "nope"}); err != nil || n != 0 {
		t.Fatalf("replay with a filter matching nothing: %d, %v", n, err)
	}
	// Replaying the holder alone brings back what waits behind it (the CDC source's
	// dead letters marked outboxdriver.WaitingBehindDeadLetter).
	if n, err := s.admin.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: []string{k[0]}}); err != nil || n < len(dead) {
		t.Fatalf("replay: %d, %v; want at least the %d dead letters of k", n, err, len(dead))
	}
	want := []string{k[0], k[1], more[0]}
	replayed := drainN(t, s, len(want))
	if got := ids(replayed); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after replay got %v, want the replayed event first, in order: %v", got, want)
	}
	for _, r := range replayed {
		if late, ok := r.Headers[wire.HeaderLate]; ok {
			t.Fatalf("event %s replayed before its aggregate's later events carries %s: %q", r.ID, wire.HeaderLate, late)
		}
	}
	if dead, _ := s.admin.ListDead(ctx, nil); len(dead) != 0 {
		t.Fatalf("dead letters left after replay: %d", len(dead))
	}
}

// testDeadLetterFlowPurge: a dead letter that does not hold its aggregate lets the
// later events flow; purging one that holds releases the events behind it, in order.
func testDeadLetterFlowPurge[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := source(t, h)
	a1 := event("a", 1)
	a1.Headers = map[string]string{"tenant": "t1"}
	a := writeCommitted(t, h, a1, event("a", 2))
	b := writeCommitted(t, h, event("b", 1), event("b", 2))
	c := claimN(t, s, 4, nil)
	complete(t, c, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{
		{ID: a[0], Error: "invalid", CountAttempt: true, Dead: true, HoldKey: false}, // flows on
		{ID: a[1], Error: "held back"},
		{ID: b[0], Error: "invalid", CountAttempt: true, Dead: true, HoldKey: true},
		{ID: b[1], Error: "held back"},
	}})
	if got := ids(drainN(t, s, 1)); fmt.Sprint(got) != fmt.Sprint(a[1:]) {
		t.Fatalf("got %v, want a's later event (flowing past its dead letter) only", got)
	}
	if n, err := s.admin.PurgeDead(ctx, &outboxdriver.DeadFilter{AggregateID: "b", OlderThan: time.Hour}); err != nil || n != 0 {
		t.Fatalf("purge of dead letters older than an hour: %d, %v", n, err)
	}
	if n, err := s.admin.PurgeDead(ctx, &outboxdriver.DeadFilter{AggregateID: "b"}); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	if got := ids(drainN(t, s, 1)); fmt.Sprint(got) != fmt.Sprint(b[1:]) {
		t.Fatalf("after purge got %v, want b's later event", got)
	}
	if dead, _ := s.admin.ListDead(ctx, nil); len(dead) != 1 || dead[0].ID != a[0] {
		t.Fatalf("dead letters = %v", dead)
	}
	// a's later event went on past it: replayed, it is marked late (its outbox-seq
	// is no version to compare), its own headers kept.
	if n, err := s.admin.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: a[:1]}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	r := drainN(t, s, 1)
	if len(r) != 1 || r[0].ID != a[0] || r[0].Headers[wire.HeaderLate] != wire.LateReplayed || r[0].Headers["tenant"] != "t1" {
		t.Fatalf("replayed after its aggregate flowed past: %+v, want headers %s=%s and tenant=t1", r, wire.HeaderLate, wire.LateReplayed)
	}
}

func testDelayed[TTx any](t *testing.T, h *Harness[TTx]) {
	s := source(t, h)
	later := event("k", 1)
	later.NotBefore = time.Now().Add(time.Hour)
	due := event("k", 2)
	due.NotBefore = time.Now().Add(-time.Second)
	ids2 := writeCommitted(t, h, later, due, event("k", 3))
	got := drainN(t, s, 2)
	if fmt.Sprint(ids(got)) != fmt.Sprint(ids2[1:]) {
		t.Fatalf("got %v, want the due events %v and not the one delayed by an hour", ids(got), ids2[1:])
	}
	// A delayed event is marked late: its aggregate's later events do not wait for it.
	if got[0].Headers[wire.HeaderLate] != wire.LateDelayed || got[1].Headers[wire.HeaderLate] != "" {
		t.Fatalf("headers %v and %v: want %s=%s on the delayed event only", got[0].Headers, got[1].Headers, wire.HeaderLate, wire.LateDelayed)
	}
	if s.stream {
		return
	}
	st, _ := s.admin.Status(ctxT(t))
	if st.Unpublished != 1 {
		t.Fatalf("status = %+v, want the delayed event waiting", st)
	}
}

// testEventStory: Event finds one event wherever it is (waiting with its latest
// error and retry time, published, archived, dead) and nothing for an id no table
// holds, a malformed one included.
func testEventStory[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	all := writeCommitted(t, h, event("w", 1), event("p", 1), event("d", 1), event("a", 1))
	waiting, published, dead, archived := all[0], all[1], all[2], all[3]
	retry := time.Now().Add(time.Hour)
	c := claimAll(t, s)
	complete(t, c, &outboxdriver.CompleteParams{Published: []string{published}, Failed: []outboxdriver.Failure{
		{ID: waiting, Error: "refused: <b>no</b>", CountAttempt: true, RetryAt: retry},
		{ID: dead, Error: "too large", CountAttempt: true, Dead: true, HoldKey: true},
		{ID: archived, Error: "later"},
	}})

	e, err := s.Event(ctx, waiting)
	if err != nil {
		t.Fatal(err)
	}
	if e.State != outboxdriver.EventWaiting || e.ID != waiting || e.AggregateID != "w" || e.Attempts != 1 ||
		e.Error != "refused: <b>no</b>" || e.AvailableAt.Sub(retry).Abs() > time.Second || string(e.Payload) != `{"n": 1}` {
		t.Fatalf("waiting event: %+v", e)
	}
	if e, err = s.Event(ctx, published); err != nil || e.State != outboxdriver.EventPublished || e.PublishedAt.IsZero() || e.Archived {
		t.Fatalf("published event: %+v, %v", e, err)
	}
	if e, err = s.Event(ctx, dead); err != nil || e.State != outboxdriver.EventDead || e.Error != "too large" || !e.HoldsKey || e.DeadAt.IsZero() {
		t.Fatalf("dead event: %+v, %v", e, err)
	}
	c, err = s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Complete(ctx, &outboxdriver.CompleteParams{Published: ids(c.Rows()), Completion: outboxdriver.CompleteArchive})
	switch {
	case errors.Is(err, outboxdriver.ErrNotSupported):
		_ = c.Release(ctx)
	case err != nil:
		t.Fatal(err)
	default:
		if e, err = s.Event(ctx, archived); err != nil || e.State != outboxdriver.EventPublished || !e.Archived {
			t.Fatalf("archived event: %+v, %v", e, err)
		}
	}
	for _, id := range []string{"0195f0a0-0000-7000-8000-000000000000", "not-a-uuid", "", "'; DROP TABLE x; --"} {
		if e, err := s.Event(ctx, id); !errors.Is(err, outboxdriver.ErrEventNotFound) {
			t.Errorf("Event(%q) = %+v, %v; want ErrEventNotFound", id, e, err)
		}
	}
}

// testRetryNow: an operator's "retry now" makes an event that waits for its retry due
// at once, its attempts kept, and leaves alone a delayed event that never failed.
func testRetryNow[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	a := writeCommitted(t, h, event("a", 1))
	delayed := event("c", 1)
	delayed.NotBefore = time.Now().Add(time.Hour)
	writeCommitted(t, h, delayed)
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil || len(c.Rows()) != 1 {
		t.Fatalf("claim: %v, %v", c, err)
	}
	complete(t, c, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{{ID: a[0], Error: "no stream", CountAttempt: true, RetryAt: time.Now().Add(time.Hour)}}})
	if n, err := s.RetryNow(ctx, &outboxdriver.WaitFilter{AggregateID: "other"}); err != nil || n != 0 {
		t.Fatalf("retry now of another aggregate: %d, %v", n, err)
	}
	if n, err := s.RetryNow(ctx, nil); err != nil || n != 1 {
		t.Fatalf("retry now: %d, %v; want the one waiting event", n, err)
	}
	c, err = s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Rows(); len(got) != 1 || got[0].ID != a[0] || got[0].Attempts != 1 {
		t.Fatalf("claimed %+v; want the retried event, with its attempt", got)
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: a})
}

// testEditDead: a dead letter's payload and headers are fixed before its replay, and
// the replayed event carries them; an unknown id is ErrEventNotFound.
func testEditDead[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	ids := writeCommitted(t, h, event("a", 1))
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil || len(c.Rows()) != 1 {
		t.Fatalf("claim: %v", err)
	}
	complete(t, c, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{{ID: ids[0], Error: "refused: schema", CountAttempt: true, Dead: true, HoldKey: true}}})
	fixed := outboxdriver.DeadEdit{Payload: []byte(`{"n":2}`), Headers: map[string]string{"schemaVersion": "2"}}
	if err := s.EditDead(ctx, ids[0], &fixed); err != nil {
		t.Fatalf("edit: %v", err)
	}
	if err := s.EditDead(ctx, "01a232ba-52e6-78df-865f-a7c25166e5cb", &fixed); !errors.Is(err, outboxdriver.ErrEventNotFound) {
		t.Fatalf("edit of no dead letter: %v, want ErrEventNotFound", err)
	}
	if n, err := s.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: ids}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	c, err = s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil || len(c.Rows()) != 1 {
		t.Fatalf("claim after replay: %v", err)
	}
	r := c.Rows()[0]
	if !jsonEqual(r.Payload, fixed.Payload) || r.Headers["schemaVersion"] != "2" {
		t.Fatalf("replayed event: payload %s headers %v; want the fixed ones", r.Payload, r.Headers)
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: ids})
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}

// testDeadPayloadPreview: a listing asked for previews (DeadFilter.PayloadMax) cuts
// each payload to that many bytes and tells its whole size; a small one comes whole.
func testDeadPayloadPreview[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	big := event("a", 1)
	big.Payload = []byte(`{"pad":"` + strings.Repeat("x", 10_000) + `"}`)
	small := event("b", 1)
	ids := writeCommitted(t, h, big, small)
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil || len(c.Rows()) != 2 {
		t.Fatalf("claim: %v", err)
	}
	var failed []outboxdriver.Failure
	for _, id := range ids {
		failed = append(failed, outboxdriver.Failure{ID: id, Error: "refused", CountAttempt: true, Dead: true})
	}
	complete(t, c, &outboxdriver.CompleteParams{Failed: failed})
	dead, err := s.ListDead(ctx, &outboxdriver.DeadFilter{PayloadMax: 100})
	if err != nil || len(dead) != 2 {
		t.Fatalf("list: %v, %v", dead, err)
	}
	for _, d := range dead {
		switch d.ID {
		case ids[0]:
			if len(d.Payload) != 100 || d.PayloadSize < 10_000 {
				t.Fatalf("the big payload: %d bytes listed, size %d; want a 100-byte preview and its whole size", len(d.Payload), d.PayloadSize)
			}
		case ids[1]:
			if d.PayloadSize != 0 || !jsonEqual(d.Payload, small.Payload) {
				t.Fatalf("the small payload: %q (size %d); want it whole", d.Payload, d.PayloadSize)
			}
		}
	}
}
