package outboxdrivertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// A claim's hold: a driver whose claims lapse when idle for HoldTimeout (its claims
// implement outboxdriver.ClaimKeeper) keeps them while they are proved alive, and
// marks what the broker acknowledged even after a claim lapsed.

// holdClaim writes two events and claims them with a hold of one second, or reports
// that the driver's claims have no hold to keep (a nil claim).
func holdClaim[TTx any](t *testing.T, h *Harness[TTx]) ([]string, outboxdriver.Store, outboxdriver.Claim) {
	t.Helper()
	want := writeCommitted(t, h, event("a", 1), event("b", 1))
	s := store(t, h)
	c, err := s.Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 10, HoldTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(outboxdriver.ClaimKeeper); !ok {
		_ = c.Release(ctxT(t))
		t.Logf("%s: claims have no hold to keep", h.Driver.Name())
		return want, s, nil
	}
	return want, s, c
}

// testClaimKeptAlive: a claim proved alive outlasts its HoldTimeout, its rows still
// locked against another claim, and completes in its own transaction.
func testClaimKeptAlive[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	want, s, c := holdClaim(t, h)
	if c == nil {
		return
	}
	defer func() { _ = c.Release(context.WithoutCancel(ctx)) }()
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
		time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a relay's pace of keep-alives across the claim's hold timeout
		if err := c.(outboxdriver.ClaimKeeper).KeepAlive(ctx); err != nil {
			t.Fatalf("keep alive: %v", err)
		}
	}
	if h.MultipleClaims {
		other, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		got := ids(other.Rows())
		_ = other.Release(ctx)
		if len(got) != 0 {
			t.Fatalf("another claim took %v from a claim kept alive past its hold", got)
		}
	}
	if err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: want}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status(ctx); err != nil || st.Unpublished != 0 || st.Published != 2 {
		t.Fatalf("status: %+v, %v; want both published", st, err)
	}
}

// testCompleteAfterHoldEnded: what the broker acknowledged is marked even when the
// database ended the claim (it idled past its hold while its batch was out), and a
// failure is recorded on its row: nothing is sent again for ever.
func testCompleteAfterHoldEnded[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	want, s, c := holdClaim(t, h)
	if c == nil {
		return
	}
	time.Sleep(2500 * time.Millisecond) //nolint:forbidigo // outlasts the claim's hold timeout: the server ends the idle claim by its own clock
	err := c.Complete(ctx, &outboxdriver.CompleteParams{Published: want[:1],
		Failed: []outboxdriver.Failure{{ID: want[1], Error: "refused", CountAttempt: true, RetryAt: time.Now().Add(time.Hour)}}})
	if err != nil {
		t.Fatalf("complete after the claim's hold ended: %v", err)
	}
	st, err := s.Status(ctx)
	if err != nil || st.Unpublished != 1 || st.Published != 1 || st.Failing != 1 {
		t.Fatalf("status: %+v, %v; want one published, one failing", st, err)
	}
	ev, err := s.Event(ctx, want[1])
	if err != nil || ev.Attempts != 1 || ev.Error != "refused" {
		t.Fatalf("the failed event: %+v, %v; want one attempt, its error", ev, err)
	}
}

// testCompleteAfterHoldEndedRowHeld: when the database ended the claim and another
// session holds a row the broker took, the write-back in a fresh transaction cannot
// mark it (it skips locked rows): Complete says so with ErrNotCompleted, never
// reports it completed (a transactional publisher's ledger would forget it was sent,
// and send it twice: found by the relay's simulation), and the row is claimed again
// once the lock goes.
func testCompleteAfterHoldEndedRowHeld[TTx any](t *testing.T, h *Harness[TTx]) {
	if h.HoldRow == nil {
		t.Skip("the database has no row locks another session could hold (one writer at a time)")
	}
	ctx := ctxT(t)
	want, s, c := holdClaim(t, h)
	if c == nil {
		return
	}
	time.Sleep(2500 * time.Millisecond) //nolint:forbidigo // outlasts the claim's hold timeout: the server ends the idle claim by its own clock
	release, err := h.HoldRow(ctx, want[1], LockForShare)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Complete(ctx, &outboxdriver.CompleteParams{Published: want})
	release()
	if !errors.Is(err, outboxdriver.ErrNotCompleted) {
		t.Fatalf("complete of a row another session held after the claim ended: %v, want ErrNotCompleted", err)
	}
	if st, err := s.Status(ctx); err != nil || st.Unpublished != 1 || st.Published != 1 {
		t.Fatalf("status: %+v, %v; want the free row published, the held one not", st, err)
	}
	if got := ids(drain(t, s)); fmt.Sprint(got) != fmt.Sprint(want[1:]) {
		t.Fatalf("after the lock: claimed %v, want the held row %v again", got, want[1:])
	}
}
