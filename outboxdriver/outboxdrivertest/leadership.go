package outboxdrivertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

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
		time.Sleep(100 * time.Millisecond) //nolint:forbidigo // a standby's retry pace while the silent holder's bound runs out on the database's clock
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
	src := source(t, h)
	l, err := src.Listen(ctx)
	listenable(t, src.Capabilities(), err)
	defer func() { _ = l.Close(ctx) }()
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

// testLeaderWaitsForOldClaims: a relay's claim can outlive its leadership (the lock's
// session ended first: the server counts each session's silence from its own last
// call). The next leader must not claim past the rows that claim still locks, or it
// publishes an aggregate's later events first: taking the leadership waits for it.
func testLeaderWaitsForOldClaims[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := store(t, h)
	want := writeCommitted(t, h, event("a", 1), event("a", 2))
	params := &outboxdriver.LeadershipParams{Timeout: 5 * time.Second}
	l1, err := s.AcquireLeadership(ctx, params)
	if err != nil || l1 == nil {
		t.Fatalf("acquire: %v, %v", l1, err)
	}
	old, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 1, HoldTimeout: time.Minute})
	if err != nil || len(old.Rows()) != 1 {
		t.Fatalf("the old leader's claim: %v", err)
	}
	if err := l1.Release(ctx); err != nil { // its lock session ends; its claim does not
		t.Fatal(err)
	}
	acquired := make(chan outboxdriver.Leadership, 1)
	go func() {
		l2, err := s.AcquireLeadership(ctx, params)
		if err != nil {
			t.Error(err)
		}
		acquired <- l2
	}()
	var l2 outboxdriver.Leadership
	select {
	case l2 = <-acquired:
		if l2 != nil {
			_ = l2.Release(ctx)
		}
		_ = old.Release(ctx)
		t.Fatal("a new leader took over while the old leader's claim still held its rows")
	case <-time.After(300 * time.Millisecond):
	}
	if err := old.Release(ctx); err != nil { // the server ends the silent claim
		t.Fatal(err)
	}
	if l2 = <-acquired; l2 == nil {
		t.Fatal("no leadership once the old claim ended")
	}
	defer func() { _ = l2.Release(context.WithoutCancel(ctx)) }()
	c, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10, HoldTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Release(context.WithoutCancel(ctx)) }()
	if got := ids(c.Rows()); len(got) != 2 || got[0] != want[0] {
		t.Fatalf("the new leader claimed %v, want %v in order", got, want)
	}
}
