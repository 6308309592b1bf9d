package outboxdrivertest

import (
	"fmt"
	"testing"

	"github.com/outboxd/outbox"
	"github.com/outboxd/outbox/outboxdriver"
)

// RowLock is how another session holds an outbox row (Harness.HoldRow).
type RowLock int

// The locks a session other than the relay may hold on a row.
const (
	LockForUpdate RowLock = iota // SELECT … FOR UPDATE
	LockForShare                 // SELECT … FOR SHARE (LOCK IN SHARE MODE)
	LockUpdate                   // an UPDATE of the row, not yet committed
)

func (l RowLock) String() string { return [...]string{"ForUpdate", "ForShare", "Update"}[l] }

// testHeadRule: a row another session holds, with any lock, keeps its aggregate's
// later rows out of the claim; every other aggregate is claimed past it. Once the
// lock goes, the aggregate goes on in order.
func testHeadRule[TTx any](t *testing.T, h *Harness[TTx]) {
	if h.HoldRow == nil {
		t.Skip("the database has no row locks another session could hold (one writer at a time)")
	}
	for _, lock := range []RowLock{LockForUpdate, LockForShare, LockUpdate} {
		t.Run(lock.String(), func(t *testing.T) {
			ctx := ctxT(t)
			s := store(t, h)
			drain(t, s)
			a := writeCommitted(t, h, event("a", 1), event("a", 2))
			b := writeCommitted(t, h, event("b", 1))
			release, err := h.HoldRow(ctx, a[0], lock)
			if err != nil {
				t.Fatal(err)
			}
			c := claimAll(t, s)
			if got := ids(c.Rows()); fmt.Sprint(got) != fmt.Sprint(b) {
				release()
				_ = c.Release(ctx)
				t.Fatalf("with a1 held (%v): claimed %v, want only b1 %v (a2 %s must wait behind a1)", lock, got, b, a[1])
			}
			complete(t, c, &outboxdriver.CompleteParams{Published: b})
			release()
			if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(a) {
				t.Fatalf("after the lock: got %v, want %v", got, a)
			}
		})
	}
}

// testHeadRuleLiveness: an aggregate held back with more rows behind its head than a
// claim takes does not fill the claim: the other aggregates' rows are claimed.
func testHeadRuleLiveness[TTx any](t *testing.T, h *Harness[TTx]) {
	if h.HoldRow == nil {
		t.Skip("the database has no row locks another session could hold (one writer at a time)")
	}
	ctx := ctxT(t)
	var evs []outbox.Event
	for i := 0; i < 30; i++ {
		evs = append(evs, event("hot", i))
	}
	hot := writeCommitted(t, h, evs...)
	cold := writeCommitted(t, h, event("cold", 1), event("cold", 2))
	release, err := h.HoldRow(ctx, hot[0], LockForUpdate)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	s := store(t, h)
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Release(ctx) }()
	if got := ids(c.Rows()); fmt.Sprint(got) != fmt.Sprint(cold) {
		t.Fatalf("claimed %v, want the other aggregate's %v past the 29 rows held back", got, cold)
	}
}

// testClaimAhead: a claim made while an earlier claim is out takes the later rows of
// that claim's aggregates only when told they were sent ahead (ClaimParams.Ahead,
// the relay's prefetch); otherwise it leaves them.
func testClaimAhead[TTx any](t *testing.T, h *Harness[TTx]) {
	if !h.MultipleClaims {
		t.Skip("driver allows one claim at a time")
	}
	ctx := ctxT(t)
	a := writeCommitted(t, h, event("a", 1), event("a", 2))
	b := writeCommitted(t, h, event("b", 1))
	s := store(t, h)
	first, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(first.Rows()); fmt.Sprint(got) != fmt.Sprint(a[:1]) {
		t.Fatalf("first claim %v, want %v", got, a[:1])
	}
	blind := claimAll(t, s)
	if got := ids(blind.Rows()); fmt.Sprint(got) != fmt.Sprint(b) {
		t.Fatalf("a claim beside the first, not told of it: %v, want only %v", got, b)
	}
	if err := blind.Release(ctx); err != nil {
		t.Fatal(err)
	}
	told, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10, Ahead: []int64{first.Rows()[0].Seq}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(told.Rows()), []string{a[1], b[0]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a claim told the first was sent ahead: %v, want %v", got, want)
	}
	complete(t, first, &outboxdriver.CompleteParams{Published: a[:1]})
	complete(t, told, &outboxdriver.CompleteParams{Published: ids(told.Rows())})
}
