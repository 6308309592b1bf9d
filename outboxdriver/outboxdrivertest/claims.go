package outboxdrivertest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

func testClaimOrder[TTx any](t *testing.T, h *Harness[TTx]) {
	s := source(t, h)
	var want []string
	for i := 0; i < 3; i++ {
		want = append(want, writeCommitted(t, h, event("a", i), event("b", i), event("a", i+10))...)
	}
	got := ids(drainN(t, s, len(want)))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("claim order\n got %v\nwant %v", got, want)
	}
}

// testClaimMaxBytes: a claim stops once its payloads reach MaxBytes (taking at least
// one row, however large), and what it left is claimed next, in order.
func testClaimMaxBytes[TTx any](t *testing.T, h *Harness[TTx]) {
	var evs []outbox.Event
	for i := range 6 {
		ev := event("a", i)
		ev.Payload = []byte(fmt.Sprintf(`{"n": %d, "pad": %q}`, i, strings.Repeat("x", 1000)))
		evs = append(evs, ev)
	}
	s := source(t, h)
	want := writeCommitted(t, h, evs...)
	var got []string
	for round := 0; len(got) < len(want) && round < 10; round++ {
		c := claimN(t, s, 2, &outboxdriver.ClaimParams{Limit: 1000, MaxBytes: 1500})
		rows := c.Rows()
		if len(rows) != 2 {
			t.Fatalf("claim with MaxBytes 1500 over rows of ~1010 bytes took %d rows, want 2", len(rows))
		}
		got = append(got, ids(rows)...)
		complete(t, c, &outboxdriver.CompleteParams{Published: ids(rows)})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("claims bounded by bytes\n got %v\nwant %v", got, want)
	}
	big := writeCommitted(t, h, outbox.Event{AggregateType: "order", AggregateID: "b", Type: "Big",
		Payload: []byte(fmt.Sprintf(`{"pad": %q}`, strings.Repeat("y", 5000)))})
	c := claimN(t, s, 1, &outboxdriver.ClaimParams{Limit: 1000, MaxBytes: 100})
	if rows := c.Rows(); len(rows) != 1 || rows[0].ID != big[0] {
		t.Fatalf("an event larger than MaxBytes: claimed %v, want it alone", ids(rows))
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: ids(c.Rows())})
}

// testLargeWrite writes more events in one call than a small-write statement holds,
// and then a few (a small write's statements), with headers on some, and reads them
// all back in order.
func testLargeWrite[TTx any](t *testing.T, h *Harness[TTx]) {
	s := source(t, h)
	for _, n := range []int{1200, 7} {
		writeAndRead(t, h, s, n)
	}
}

func writeAndRead[TTx any](t *testing.T, h *Harness[TTx], s side, n int) {
	t.Helper()
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = event(fmt.Sprint(i%7), i)
		if i%3 == 0 {
			evs[i].Headers = map[string]string{"correlationId": fmt.Sprint("c-", i)}
		}
	}
	want := writeCommitted(t, h, evs...)
	rows := drainN(t, s, len(want))
	if fmt.Sprint(ids(rows)) != fmt.Sprint(want) {
		t.Fatalf("read back %d rows out of order or incomplete (wrote %d)", len(rows), len(want))
	}
	for i, r := range rows {
		if string(r.Payload) != fmt.Sprintf(`{"n": %d}`, i) {
			t.Fatalf("row %d payload %s", i, r.Payload)
		}
		if (i%3 == 0) != (r.Headers["correlationId"] == fmt.Sprint("c-", i)) {
			t.Fatalf("row %d headers %v", i, r.Headers)
		}
	}
}

func testSkipLocked[TTx any](t *testing.T, h *Harness[TTx]) {
	if !h.MultipleClaims {
		t.Skip("driver allows one claim at a time")
	}
	ctx := ctxT(t)
	var evs []outbox.Event
	for i := 0; i < 20; i++ {
		evs = append(evs, event(fmt.Sprint(i%4), i))
	}
	all := writeCommitted(t, h, evs...)
	s := store(t, h)
	c1, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	// The second claim is told the first one's rows were sent ahead (the relay's
	// prefetch): every aggregate here has rows in both.
	c2, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100, Ahead: seqsOf(c1.Rows())})
	if err != nil {
		t.Fatal(err)
	}
	got1, got2 := ids(c1.Rows()), ids(c2.Rows())
	if fmt.Sprint(got1) != fmt.Sprint(all[:8]) || fmt.Sprint(got2) != fmt.Sprint(all[8:]) {
		t.Fatalf("claims overlap or lose order:\n c1 %v\n c2 %v", got1, got2)
	}
	// A released claim's rows come back.
	if err := c1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c2.Complete(ctx, &outboxdriver.CompleteParams{Published: got2}); err != nil {
		t.Fatal(err)
	}
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(all[:8]) {
		t.Fatalf("after release got %v, want %v", got, all[:8])
	}
}

// testLateCommit: a transaction that began first but commits after later ones must not
// be skipped (the high-water-mark bug, watermill#311).
func testLateCommit[TTx any](t *testing.T, h *Harness[TTx]) {
	if !h.ConcurrentWriters {
		t.Skip("a single-writer database cannot hold a transaction open beside another")
	}
	ctx := ctxT(t)
	w := writer(t, h)
	slow, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	late := event("late", 1)
	if err := w.WriteTx(ctx, slow, late); err != nil {
		t.Fatal(err)
	}
	early := writeCommitted(t, h, event("early", 1))
	s := store(t, h)
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(early) {
		t.Fatalf("got %v, want %v", got, early)
	}
	if err := h.Commit(ctx, slow); err != nil {
		t.Fatal(err)
	}
	if got := ids(drain(t, s)); len(got) != 1 || got[0] != late.ID {
		t.Fatalf("late commit: got %v, want [%s]", got, late.ID)
	}
}

func testComplete[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	all := writeCommitted(t, h, event("a", 1), event("a", 2), event("a", 3), event("a", 4))
	s := store(t, h)
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: all[:2]}); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx); err != nil {
		t.Fatalf("release after complete: %v", err)
	}
	c, err = s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: all[2:3], Completion: outboxdriver.CompleteDelete}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unpublished != 1 || st.Published != 2 {
		t.Fatalf("status = %+v, want 1 unpublished and 2 published kept (one deleted)", st)
	}
}

// testCompletePublished: a table store completes published rows outside any claim
// (outboxdriver.Completer: a transactional publisher's resume, the CDC source), marked
// or deleted as asked; ids it does not hold, or already completed, change nothing.
func testCompletePublished[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	all := writeCommitted(t, h, event("a", 1), event("a", 2), event("b", 1), event("c", 1))
	s := store(t, h)
	cp, ok := s.(outboxdriver.Completer)
	if !ok {
		t.Fatalf("%T completes nothing outside a claim (outboxdriver.Completer)", s)
	}
	if err := cp.CompletePublished(ctx, []string{all[0], all[2], uuid.NewString()}, outboxdriver.CompleteMark); err != nil {
		t.Fatal(err)
	}
	if err := cp.CompletePublished(ctx, []string{all[1], all[0]}, outboxdriver.CompleteDelete); err != nil {
		t.Fatal(err)
	}
	if err := cp.CompletePublished(ctx, nil, outboxdriver.CompleteMark); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unpublished != 1 || st.Published != 1 {
		t.Fatalf("status = %+v, want 1 unpublished (c1) and 1 published kept (b1; a1 and a2 deleted)", st)
	}
	c := claimAll(t, s)
	defer func() { _ = c.Release(ctx) }()
	if rows := c.Rows(); len(rows) != 1 || rows[0].ID != all[3] {
		t.Fatalf("claimed %v, want only c1", rows)
	}
}

func seqsOf(rows []outboxdriver.Row) []int64 {
	out := make([]int64, len(rows))
	for i := range rows {
		out[i] = rows[i].Seq
	}
	return out
}

// claimAll claims everything claimable now and returns the claim (still held).
func claimAll(t *testing.T, s outboxdriver.Source) outboxdriver.Claim {
	t.Helper()
	c, err := s.Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func complete(t *testing.T, c outboxdriver.Claim, p *outboxdriver.CompleteParams) {
	t.Helper()
	if err := c.Complete(ctxT(t), p); err != nil {
		t.Fatal(err)
	}
}

// testClaimColumns: a claim asked for custom columns (a Debezium table's) reads them
// with each row, typed; a driver without them refuses the claim with ErrNotSupported.
func testClaimColumns[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	if !s.Capabilities().Columns {
		if _, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10, Columns: []string{"tenant"}}); !errors.Is(err, outboxdriver.ErrNotSupported) {
			t.Fatalf("claim with columns: err = %v, want ErrNotSupported", err)
		}
		t.Skip("the driver declares no custom columns (PostgreSQL only)")
	}
	if h.AddColumn == nil {
		t.Fatal("the driver declares custom columns: its harness needs AddColumn")
	}
	if err := h.AddColumn(ctx, "tenant", "text DEFAULT 'acme'"); err != nil {
		t.Fatal(err)
	}
	if err := h.AddColumn(ctx, "version", "integer"); err != nil {
		t.Fatal(err)
	}
	writeCommitted(t, h, event("a", 1))
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10, Columns: []string{"tenant", "version"}})
	if err != nil || len(c.Rows()) != 1 {
		t.Fatalf("claim: %v", err)
	}
	got := c.Rows()[0].Columns
	if got["tenant"] != (outboxdriver.Value{Type: "text", V: "acme"}) || got["version"] != (outboxdriver.Value{Type: "integer"}) {
		t.Fatalf("columns: %#v", got)
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: ids(c.Rows())})
}

// testCompleteArchive: completion "archive" moves published rows out of the table in
// the claim's transaction: they are never claimed again, status counts them as
// published, cleanup removes them after the retention. Drivers without an archive
// refuse it with ErrNotSupported.
func testCompleteArchive[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	all := writeCommitted(t, h, event("a", 1), event("a", 2), event("b", 1), event("b", 2))
	s := store(t, h)
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Complete(ctx, &outboxdriver.CompleteParams{Published: ids(c.Rows()), Completion: outboxdriver.CompleteArchive})
	if !s.Capabilities().Completes(outboxdriver.CompleteArchive) {
		if !errors.Is(err, outboxdriver.ErrNotSupported) {
			t.Fatalf("archive completion on a driver that does not declare it: %v, want ErrNotSupported", err)
		}
		t.Skip("the driver declares no archive table (PostgreSQL only)")
	}
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Status(ctx); st.Unpublished != 2 || st.Published != 2 {
		t.Fatalf("status after archiving 2: %+v", st)
	}
	c, err = s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(c.Rows()); fmt.Sprint(got) != fmt.Sprint(all[2:]) {
		t.Fatalf("claim after archiving: %v, want %v", got, all[2:])
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: ids(c.Rows()), Completion: outboxdriver.CompleteArchive})
	if st, _ := s.Status(ctx); st.Unpublished != 0 || st.Published != 4 {
		t.Fatalf("status after archiving all: %+v", st)
	}
	if n, err := s.Cleanup(ctx, &outboxdriver.CleanupParams{Before: time.Now().Add(-time.Hour), Limit: 100}); err != nil || n != 0 {
		t.Fatalf("cleanup within the retention removed %d (%v)", n, err)
	}
	if n, err := s.Cleanup(ctx, &outboxdriver.CleanupParams{Before: time.Now().Add(time.Hour), Limit: 100}); err != nil || n != 4 {
		t.Fatalf("cleanup past the retention removed %d, want 4 (%v)", n, err)
	}
}
