// Package outboxdrivertest is the conformance suite every database driver passes. A
// behaviour the writer or relay relies on is added here first, then to each driver.
package outboxdrivertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

// Harness is one driver under test, on a table of the test's own (not yet migrated).
type Harness[TTx any] struct {
	Driver   outboxdriver.Driver[TTx]
	Begin    func(ctx context.Context) (TTx, error)
	Commit   func(ctx context.Context, tx TTx) error
	Rollback func(ctx context.Context, tx TTx) error
	// InsertPlain inserts a row with only the five Debezium columns, by plain SQL, as
	// a producer in another language would.
	InsertPlain func(ctx context.Context, id, aggregateType, aggregateID, typ, payload string) error
	// MultipleClaims says the store lets two claims be held at once.
	MultipleClaims bool
	// ConcurrentWriters says two write transactions can be open at once (not SQLite).
	ConcurrentWriters bool
	// NonUniqueIDs says the table cannot refuse a second event with the same id
	// (a partitioned table's keys include the partition column).
	NonUniqueIDs bool
}

// NewFunc builds a fresh harness whose table has the given payload type.
type NewFunc[TTx any] func(t *testing.T, payload outboxdriver.PayloadType) *Harness[TTx]

// Run runs the suite.
func Run[TTx any](t *testing.T, newHarness NewFunc[TTx]) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h *Harness[TTx])
	}{
		{"MigrateIdempotent", testMigrate[TTx]},
		{"MissingTable", testMissingTable[TTx]},
		{"CommitVisibleRollbackNot", testCommitRollback[TTx]},
		{"ClaimInWriteOrder", testClaimOrder[TTx]},
		{"ClaimBoundedByBytes", testClaimMaxBytes[TTx]},
		{"LargeWrite", testLargeWrite[TTx]},
		{"ClaimSkipsLocked", testSkipLocked[TTx]},
		{"LateCommitNotSkipped", testLateCommit[TTx]},
		{"CompleteMarksAndDeletes", testComplete[TTx]},
		{"FailuresCounted", testFailures[TTx]},
		{"PlainSQLInsert", testPlainSQL[TTx]},
		{"InvalidEventsWriteNothing", testInvalid[TTx]},
		{"DuplicateID", testDuplicate[TTx]},
		{"Leadership", testLeadership[TTx]},
		{"LeadershipRevokedWhenSilent", testLeadershipRevoked[TTx]},
		{"Listen", testListen[TTx]},
		{"Status", testStatus[TTx]},
		{"FailingEventBlocksItsAggregate", testFailingBlocks[TTx]},
		{"DeadLetterHoldReplay", testDeadLetterReplay[TTx]},
		{"DeadLetterFlowPurge", testDeadLetterFlowPurge[TTx]},
		{"DelayedEvents", testDelayed[TTx]},
		{"CleanupNeverDeletesUnpublished", testCleanup[TTx]},
		{"TraceContextStored", testTraceContext[TTx]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, outboxdriver.PayloadJSON)
			if tc.name != "MissingTable" {
				migrate(t, h)
			}
			tc.fn(t, h)
		})
	}
	t.Run("BytesPayload", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, outboxdriver.PayloadBytes)
		migrate(t, h)
		testBytesPayload(t, h)
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func migrate[TTx any](t *testing.T, h *Harness[TTx]) {
	m, err := h.Driver.Migrator()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Migrate(ctxT(t)); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}

func store[TTx any](t *testing.T, h *Harness[TTx]) outboxdriver.Store {
	s, err := h.Driver.Store()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writer[TTx any](t *testing.T, h *Harness[TTx]) *outbox.Writer[TTx] {
	w, err := outbox.NewWriter(h.Driver, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func event(agg string, n int) outbox.Event {
	return outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: agg, Type: "OrderPlaced", Payload: []byte(fmt.Sprintf(`{"n": %d}`, n))}
}

// writeCommitted writes events in one committed transaction and returns their ids.
func writeCommitted[TTx any](t *testing.T, h *Harness[TTx], evs ...outbox.Event) []string {
	t.Helper()
	ctx := ctxT(t)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := writer(t, h).WriteTx(ctx, tx, evs...); err != nil {
		_ = h.Rollback(ctx, tx)
		t.Fatal(err)
	}
	if err := h.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(evs))
	for i := range evs {
		ids[i] = evs[i].ID
	}
	return ids
}

// drain claims everything and completes it as published, returning the rows in order.
func drain(t *testing.T, s outboxdriver.Store) []outboxdriver.Row {
	t.Helper()
	ctx := ctxT(t)
	var all []outboxdriver.Row
	for {
		c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		rows := c.Rows()
		if len(rows) == 0 {
			return all
		}
		all = append(all, rows...)
		if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: ids(rows)}); err != nil {
			t.Fatal(err)
		}
	}
}

func ids(rows []outboxdriver.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func testMigrate[TTx any](t *testing.T, h *Harness[TTx]) {
	m, _ := h.Driver.Migrator()
	applied, err := m.Migrate(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Fatalf("second migrate applied %v", applied)
	}
	sql, err := m.SQL()
	if err != nil || len(sql) == 0 {
		t.Fatalf("SQL() = %q, %v", sql, err)
	}
}

func testMissingTable[TTx any](t *testing.T, h *Harness[TTx]) {
	_, err := store(t, h).Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 10})
	if !errors.Is(err, outboxdriver.ErrTableMissing) {
		t.Fatalf("claim on a missing table: err = %v, want ErrTableMissing", err)
	}
	_, err = store(t, h).Status(ctxT(t))
	if !errors.Is(err, outboxdriver.ErrTableMissing) {
		t.Fatalf("status on a missing table: err = %v, want ErrTableMissing", err)
	}
}

func testCommitRollback[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	w := writer(t, h)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTx(ctx, tx, event("rolled-back", 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	kept := writeCommitted(t, h, event("committed", 1))
	rows := drain(t, store(t, h))
	if len(rows) != 1 || rows[0].ID != kept[0] {
		t.Fatalf("claimed %v, want only the committed event %s", ids(rows), kept[0])
	}
}

func testClaimOrder[TTx any](t *testing.T, h *Harness[TTx]) {
	var want []string
	for i := 0; i < 3; i++ {
		want = append(want, writeCommitted(t, h, event("a", i), event("b", i), event("a", i+10))...)
	}
	got := ids(drain(t, store(t, h)))
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
	want := writeCommitted(t, h, evs...)
	s := store(t, h)
	var got []string
	for round := 0; len(got) < len(want) && round < 10; round++ {
		c, err := s.Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 1000, MaxBytes: 1500})
		if err != nil {
			t.Fatal(err)
		}
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
	c, err := s.Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 1000, MaxBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	if rows := c.Rows(); len(rows) != 1 || rows[0].ID != big[0] {
		t.Fatalf("an event larger than MaxBytes: claimed %v, want it alone", ids(rows))
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: ids(c.Rows())})
}

// testLargeWrite writes more events in one call than a small-write statement holds,
// with headers on some, and reads them all back in order.
func testLargeWrite[TTx any](t *testing.T, h *Harness[TTx]) {
	evs := make([]outbox.Event, 1200)
	for i := range evs {
		evs[i] = event(fmt.Sprint(i%7), i)
		if i%3 == 0 {
			evs[i].Headers = map[string]string{"correlationId": fmt.Sprint("c-", i)}
		}
	}
	want := writeCommitted(t, h, evs...)
	rows := drain(t, store(t, h))
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
	c2, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100})
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
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: all[2:3], Delete: true}); err != nil {
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

func testFailures[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	all := writeCommitted(t, h, event("a", 1), event("b", 1))
	s := store(t, h)
	for i := 0; i < 3; i++ {
		c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Complete(ctx, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{
			{ID: all[0], Error: "refused", CountAttempt: true},
			{ID: all[1], Error: "broker down", CountAttempt: false},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	rows := drain(t, s)
	if len(rows) != 2 || rows[0].Attempts != 3 || rows[1].Attempts != 0 {
		t.Fatalf("attempts = %+v, want 3 for the refused event and 0 for the unavailable broker", rows)
	}
}

func testPlainSQL[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	id := uuid.NewString()
	if err := h.InsertPlain(ctx, id, "invoice", "inv-7", "InvoiceIssued", `{"total": 12}`); err != nil {
		t.Fatal(err)
	}
	rows := drain(t, store(t, h))
	if len(rows) != 1 {
		t.Fatalf("claimed %d rows, want 1", len(rows))
	}
	r := rows[0]
	if r.ID != id || r.AggregateType != "invoice" || r.AggregateID != "inv-7" || r.Type != "InvoiceIssued" || r.CreatedAt.IsZero() {
		t.Fatalf("row = %+v", r)
	}
	if string(r.Payload) != `{"total": 12}` {
		t.Fatalf("payload = %s", r.Payload)
	}
}

func testInvalid[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	w := writer(t, h)
	good := event("a", 1)
	for name, bad := range map[string]outbox.Event{
		"non-JSON payload":   {AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte("\xff\x00not json")},
		"empty payload":      {AggregateType: "order", AggregateID: "1", Type: "T"},
		"NUL escape":         {AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{"a":"\u0000"}`)},
		"empty aggregate id": {AggregateType: "order", Type: "T", Payload: []byte(`{}`)},
		"bad id":             {ID: "nope", AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`)},
		"reserved header":    {AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`), Headers: map[string]string{"Nats-Msg-Id": "x"}},
		"invalid UTF-8 type": {AggregateType: "order", AggregateID: "1", Type: "\xff", Payload: []byte(`{}`)},
	} {
		tx, err := h.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = w.WriteTx(ctx, tx, good, bad)
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: err = %v, want ErrInvalidEvent", name, err)
		}
		// The transaction is still usable: nothing was sent to the database.
		if err := h.Commit(ctx, tx); err != nil {
			t.Errorf("%s: commit after a refused write: %v", name, err)
		}
	}
	if rows := drain(t, store(t, h)); len(rows) != 0 {
		t.Fatalf("refused writes left %d rows", len(rows))
	}
}

func testDuplicate[TTx any](t *testing.T, h *Harness[TTx]) {
	if h.NonUniqueIDs {
		t.Skip("the table does not enforce unique event ids (partitioned)")
	}
	ctx := ctxT(t)
	ev := event("a", 1)
	writeCommitted(t, h, ev)
	tx, err := h.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Rollback(ctx, tx) }()
	if err := writer(t, h).WriteTx(ctx, tx, ev); !errors.Is(err, outboxdriver.ErrDuplicateID) {
		t.Fatalf("duplicate id: err = %v, want ErrDuplicateID", err)
	}
}

func testLeadership[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	l1, err := s.AcquireLeadership(ctx, &outboxdriver.LeadershipParams{Timeout: 10 * time.Second})
	if err != nil || l1 == nil {
		t.Fatalf("first acquire: %v, %v", l1, err)
	}
	if err := l1.Check(ctx); err != nil {
		t.Fatalf("check: %v", err)
	}
	if st, err := s.Status(ctx); err != nil || st.ActiveRelay == "" {
		t.Fatalf("status while a relay leads: %+v, %v; want the active relay named", st, err)
	}
	l2, err := s.AcquireLeadership(ctx, &outboxdriver.LeadershipParams{Timeout: 10 * time.Second})
	if err != nil || l2 != nil {
		t.Fatalf("second acquire while held: %v, %v; want nil, nil", l2, err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := l1.Check(ctx); !errors.Is(err, outboxdriver.ErrLeadershipLost) {
		t.Fatalf("check after release: %v", err)
	}
	if st, err := s.Status(ctx); err != nil || st.ActiveRelay != "" {
		t.Fatalf("status with no relay: %+v, %v", st, err)
	}
	l3, err := s.AcquireLeadership(ctx, &outboxdriver.LeadershipParams{Timeout: 10 * time.Second})
	if err != nil || l3 == nil {
		t.Fatalf("acquire after release: %v, %v", l3, err)
	}
	_ = l3.Release(ctx)
}

// testLeadershipRevoked: a leader that stops proving it is alive (no Check) loses the
// leadership by a bound the database enforces (params.Timeout, or the driver's own
// lease), so a standby gets it; the silent one then learns it was lost.
func testLeadershipRevoked[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	params := &outboxdriver.LeadershipParams{Timeout: time.Second}
	l1, err := s.AcquireLeadership(ctx, params)
	if err != nil || l1 == nil {
		t.Fatalf("acquire: %v, %v", l1, err)
	}
	defer func() { _ = l1.Release(context.WithoutCancel(ctx)) }()
	bound := params.Timeout
	if b, ok := l1.(outboxdriver.LeaseBound); ok {
		bound = b.Bound()
	}
	if bound > 5*time.Second {
		t.Skipf("the driver's leadership bound is %v; too long for this test", bound)
	}
	var l2 outboxdriver.Leadership
	deadline := time.Now().Add(bound + 3*time.Second)
	for l2 == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if l2, err = s.AcquireLeadership(ctx, params); err != nil {
			t.Fatal(err)
		}
	}
	if l2 == nil {
		t.Fatalf("a leader silent for %v still holds the leadership (bound %v)", bound+3*time.Second, bound)
	}
	defer func() { _ = l2.Release(context.WithoutCancel(ctx)) }()
	if err := l1.Check(ctx); err == nil {
		t.Fatal("the silent leader's check passes after a standby took over")
	}
}

func testListen[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	l, err := store(t, h).Listen(ctx)
	if errors.Is(err, outboxdriver.ErrNotSupported) {
		t.Skip("driver declares no LISTEN/NOTIFY")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		writeCommitted(t, h, event("a", 1))
	}()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Wait(wctx); err != nil {
		t.Fatalf("no notification after a write: %v", err)
	}
	wg.Wait()
}

func testStatus[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unpublished != 0 || st.OldestAge != 0 {
		t.Fatalf("empty table status = %+v", st)
	}
	writeCommitted(t, h, event("a", 1), event("b", 1))
	st, err = s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Unpublished != 2 || st.OldestAge <= 0 || st.OldestAge > time.Minute {
		t.Fatalf("status = %+v, want 2 unpublished with a small positive age", st)
	}
}

func testBytesPayload[TTx any](t *testing.T, h *Harness[TTx]) {
	raw := []byte("\x00\xffnot json at all\n")
	ev := outbox.Event{AggregateType: "blob", AggregateID: "1", Type: "Raw", Payload: raw}
	empty := outbox.Event{AggregateType: "blob", AggregateID: "1", Type: "Empty"}
	writeCommitted(t, h, ev, empty)
	rows := drain(t, store(t, h))
	if len(rows) != 2 || string(rows[0].Payload) != string(raw) || len(rows[1].Payload) != 0 || rows[1].PayloadNull {
		t.Fatalf("rows = %+v", rows)
	}
}

// claimAll claims everything claimable now and returns the claim (still held).
func claimAll(t *testing.T, s outboxdriver.Store) outboxdriver.Claim {
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

func testFailingBlocks[TTx any](t *testing.T, h *Harness[TTx]) {
	s := store(t, h)
	k := writeCommitted(t, h, event("k", 1), event("k", 2), event("k", 3))
	late := writeCommitted(t, h, event("late", 1), event("late", 2))
	other := writeCommitted(t, h, event("other", 1))
	c := claimAll(t, s)
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
	c = claimAll(t, s)
	if got := ids(c.Rows()); fmt.Sprint(got) != fmt.Sprint(k[:1]) {
		t.Fatalf("claimed %v; want only the failing event %s, retried alone", got, k[0])
	}
	if c.Rows()[0].Attempts != 1 {
		t.Fatalf("attempts = %d, want 1", c.Rows()[0].Attempts)
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: k[:1]})
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(k[1:]) {
		t.Fatalf("after the retry succeeded: %v, want %v", got, k[1:])
	}
	st, _ := s.Status(ctxT(t))
	if st.Unpublished != 2 || st.Failing != 1 {
		t.Fatalf("status = %+v, want late's two events waiting, one failing", st)
	}
}

func testDeadLetterReplay[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	k := writeCommitted(t, h, event("k", 1), event("k", 2))
	other := writeCommitted(t, h, event("other", 1))
	c := claimAll(t, s)
	complete(t, c, &outboxdriver.CompleteParams{Published: other, Failed: []outboxdriver.Failure{
		{ID: k[0], Error: "too large", CountAttempt: true, Dead: true, HoldKey: true},
		{ID: k[1], Error: "held back"},
	}})
	more := writeCommitted(t, h, event("k", 3), event("other", 2))
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(more[1:]) {
		t.Fatalf("while k is quarantined got %v, want only %v", got, more[1:])
	}
	dead, err := s.ListDead(ctx, &outboxdriver.DeadFilter{AggregateID: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != k[0] || dead[0].Error != "too large" || dead[0].Attempts != 1 || !dead[0].HoldsKey ||
		string(dead[0].Payload) != `{"n": 1}` {
		t.Fatalf("dead letters = %+v", dead)
	}
	st, _ := s.Status(ctx)
	if st.Dead != 1 || st.HeldKeys != 1 {
		t.Fatalf("status = %+v, want 1 dead letter holding 1 key", st)
	}
	if n, err := s.ReplayDead(ctx, &outboxdriver.DeadFilter{AggregateType: "nope"}); err != nil || n != 0 {
		t.Fatalf("replay with a filter matching nothing: %d, %v", n, err)
	}
	if n, err := s.ReplayDead(ctx, &outboxdriver.DeadFilter{IDs: []string{k[0]}}); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	want := []string{k[0], k[1], more[0]}
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after replay got %v, want the replayed event first, in order: %v", got, want)
	}
	if dead, _ := s.ListDead(ctx, nil); len(dead) != 0 {
		t.Fatalf("dead letters left after replay: %d", len(dead))
	}
}

func testDeadLetterFlowPurge[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	a := writeCommitted(t, h, event("a", 1), event("a", 2))
	b := writeCommitted(t, h, event("b", 1), event("b", 2))
	c := claimAll(t, s)
	complete(t, c, &outboxdriver.CompleteParams{Failed: []outboxdriver.Failure{
		{ID: a[0], Error: "invalid", CountAttempt: true, Dead: true, HoldKey: false}, // flows on
		{ID: a[1], Error: "held back"},
		{ID: b[0], Error: "invalid", CountAttempt: true, Dead: true, HoldKey: true},
		{ID: b[1], Error: "held back"},
	}})
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(a[1:]) {
		t.Fatalf("got %v, want a's later event (flowing past its dead letter) only", got)
	}
	if n, err := s.PurgeDead(ctx, &outboxdriver.DeadFilter{AggregateID: "b", OlderThan: time.Hour}); err != nil || n != 0 {
		t.Fatalf("purge of dead letters older than an hour: %d, %v", n, err)
	}
	if n, err := s.PurgeDead(ctx, &outboxdriver.DeadFilter{AggregateID: "b"}); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(b[1:]) {
		t.Fatalf("after purge got %v, want b's later event", got)
	}
	if dead, _ := s.ListDead(ctx, nil); len(dead) != 1 || dead[0].ID != a[0] {
		t.Fatalf("dead letters = %v", dead)
	}
}

func testDelayed[TTx any](t *testing.T, h *Harness[TTx]) {
	s := store(t, h)
	later := event("k", 1)
	later.NotBefore = time.Now().Add(time.Hour)
	due := event("k", 2)
	due.NotBefore = time.Now().Add(-time.Second)
	ids2 := writeCommitted(t, h, later, due, event("k", 3))
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(ids2[1:]) {
		t.Fatalf("got %v, want the due events %v and not the one delayed by an hour", got, ids2[1:])
	}
	st, _ := s.Status(ctxT(t))
	if st.Unpublished != 1 {
		t.Fatalf("status = %+v, want the delayed event waiting", st)
	}
}

// testCleanup is a property test: whatever mix of published, unpublished, failing and
// delayed rows, cleanup removes only published rows older than the cutoff.
func testCleanup[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for round := 0; round < 5; round++ {
		n := 20 + rng.IntN(40)
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = event(fmt.Sprint(rng.IntN(5)), i)
			if rng.IntN(6) == 0 {
				evs[i].NotBefore = time.Now().Add(time.Hour)
			}
		}
		writeCommitted(t, h, evs...)
		c := claimAll(t, s)
		var p outboxdriver.CompleteParams
		for _, r := range c.Rows() {
			switch rng.IntN(3) {
			case 0:
				p.Published = append(p.Published, r.ID)
			case 1:
				p.Failed = append(p.Failed, outboxdriver.Failure{ID: r.ID, Error: "x", CountAttempt: true, RetryAt: time.Now().Add(time.Hour)})
			}
		}
		complete(t, c, &p)
	}
	before, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A cutoff in the past deletes nothing; one in the future deletes every published row.
	if n, err := s.Cleanup(ctx, &outboxdriver.CleanupParams{Before: time.Now().Add(-time.Hour), Limit: 1000}); err != nil || n != 0 {
		t.Fatalf("cleanup of rows published over an hour ago: %d, %v", n, err)
	}
	var total int64
	for {
		n, err := s.Cleanup(ctx, &outboxdriver.CleanupParams{Before: time.Now().Add(time.Hour), Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		total += n
		if n < 7 {
			break
		}
	}
	after, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if total != before.Published || after.Published != 0 || after.Unpublished != before.Unpublished || after.Failing != before.Failing {
		t.Fatalf("cleanup deleted %d; status before %+v, after %+v: only the %d published rows may go", total, before, after, before.Published)
	}
}

// testTraceContext: the writer's trace context lands in tracingspancontext, for small
// and large writes alike.
func testTraceContext[TTx any](t *testing.T, h *Harness[TTx]) {
	const tc = "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=vendor=x"
	w, err := outbox.NewWriter(h.Driver, &outbox.Config{TraceContext: func(context.Context) string { return tc }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for _, n := range []int{1, 40} {
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = event("k", i)
		}
		tx, err := h.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteTx(ctx, tx, evs...); err != nil {
			t.Fatal(err)
		}
		if err := h.Commit(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	rows := drain(t, store(t, h))
	if len(rows) != 41 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.TraceContext != tc {
			t.Fatalf("row %d trace context %q", r.Seq, r.TraceContext)
		}
	}
}
