package outboxdrivertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

// testGroupFencing: a relay whose partition leases were taken over (a new epoch)
// cannot complete its claimed rows any more (mark, or move them to the archive); the
// new owner can. Drivers without a group store (one active relay only) skip it.
func testGroupFencing[TTx any](t *testing.T, h *Harness[TTx]) {
	groupFencing(t, h, outboxdriver.CompleteMark)
}

func testGroupFencingArchive[TTx any](t *testing.T, h *Harness[TTx]) {
	groupFencing(t, h, outboxdriver.CompleteArchive)
}

func groupFencing[TTx any](t *testing.T, h *Harness[TTx], completion outboxdriver.Completion) {
	t.Helper()
	ctx := ctxT(t)
	s := store(t, h)
	gs, ok := s.(outboxdriver.GroupStore)
	if !ok {
		t.Skip("the driver is no GroupStore: one active relay at a time (leadership), no partitions")
	}
	evs := make([]outbox.Event, 20)
	for i := range evs {
		evs[i] = event(fmt.Sprint(i), i)
	}
	ids := writeCommitted(t, h, evs...)
	all := make([]int, outboxdriver.PartitionsDefault)
	for i := range all {
		all[i] = i
	}
	const ttl = 500 * time.Millisecond
	leases, err := gs.Leases(ctx, &outboxdriver.LeaseParams{RelayID: "a", Want: all, TTL: ttl})
	if err != nil || len(leases) != len(all) {
		t.Fatalf("leases for a: %d, %v", len(leases), err)
	}
	if again, _ := gs.Leases(ctx, &outboxdriver.LeaseParams{RelayID: "b", Want: all, TTL: ttl}); len(again) != 0 {
		t.Fatalf("b took %d partitions a holds", len(again))
	}
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100, HoldTimeout: time.Minute, Group: &outboxdriver.ClaimGroup{RelayID: "a", Leases: leases}})
	if err != nil || len(c.Rows()) != len(ids) {
		t.Fatalf("a's claim: %v", err)
	}
	// a pauses past its lease; b takes the partitions over with a new epoch.
	time.Sleep(ttl + 200*time.Millisecond) //nolint:forbidigo // outlasts a's lease, which the database judges by its own clock
	bl, err := gs.Leases(ctx, &outboxdriver.LeaseParams{RelayID: "b", Want: all, TTL: time.Hour})
	if err != nil || len(bl) != len(all) || bl[0].Epoch <= leases[0].Epoch {
		t.Fatalf("takeover: %v, %v", bl, err)
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: ids, Completion: completion})
	if st, _ := s.Status(ctx); st.Unpublished != int64(len(ids)) {
		t.Fatalf("the fenced relay marked %d rows", int64(len(ids))-st.Unpublished)
	}
	// A claim of a's that the server runs only now (sent before the pause, delivered
	// late) takes nothing: its leases moved. Were it to lock an aggregate's earlier
	// rows, b's claim would skip them and take the later ones.
	stale, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100, HoldTimeout: time.Minute, Group: &outboxdriver.ClaimGroup{RelayID: "a", Leases: leases}})
	if err != nil {
		t.Fatal(err)
	}
	n := len(stale.Rows())
	_ = stale.Release(ctx)
	if n != 0 {
		t.Fatalf("a claim under leases that moved took %d rows; want none", n)
	}
	c2, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100, HoldTimeout: time.Minute, Group: &outboxdriver.ClaimGroup{RelayID: "b", Leases: bl}})
	if err != nil || len(c2.Rows()) != len(ids) {
		t.Fatalf("b's claim: %v", err)
	}
	complete(t, c2, &outboxdriver.CompleteParams{Published: ids, Completion: completion})
	if st, _ := s.Status(ctx); st.Unpublished != 0 || st.Published != int64(len(ids)) {
		t.Fatalf("the owner's mark left %d rows", st.Unpublished)
	}
}

// testClaimMaxSeq: a claim bounded by MaxSeq (the CDC relay's backfill) takes only rows
// written up to it, or the driver says it cannot (ErrNotSupported).
func testClaimMaxSeq[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	writeCommitted(t, h, event("a", 0), event("a", 1), event("a", 2), event("a", 3))
	s := store(t, h)
	c := claimAll(t, s)
	rows := c.Rows()
	if err := c.Release(ctx); err != nil {
		t.Fatal(err)
	}
	bounded, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 100, MaxSeq: rows[1].Seq})
	if !s.Capabilities().MaxSeq {
		if !errors.Is(err, outboxdriver.ErrNotSupported) {
			t.Fatalf("a bounded claim on a driver that does not declare it: %v, want ErrNotSupported", err)
		}
		t.Skip("the driver declares no bounded claim (CDC is PostgreSQL's)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bounded.Release(ctx) }()
	if got := ids(bounded.Rows()); fmt.Sprint(got) != fmt.Sprint(ids(rows[:2])) {
		t.Fatalf("claim up to seq %d: %v, want %v", rows[1].Seq, got, ids(rows[:2]))
	}
}
