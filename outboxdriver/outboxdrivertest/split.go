package outboxdrivertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// testSplitComplete: a claim completed in parts (Capabilities.Split). Complete
// writes the aggregates the broker answered and leaves a slow one's rows in flight,
// unlocked; a claim that skips that aggregate takes none of its events, the earlier
// nor the later; Settle then writes the slow one's outcome, and only on rows nothing
// touched since (on a stream: still waiting in its queue as Complete left it). A
// source without Split refuses Skip with ErrNotSupported.
func testSplitComplete[TTx any](t *testing.T, h *Harness[TTx]) {
	ctx := ctxT(t)
	s := source(t, h)
	if !s.Capabilities().Split {
		if _, err := s.Claim(ctx, &outboxdriver.ClaimParams{Limit: 10, Skip: []outboxdriver.Aggregate{{Type: "order", ID: "slow"}}}); !errors.Is(err, outboxdriver.ErrNotSupported) {
			t.Fatalf("claim with Skip on a source without Split: %v, want ErrNotSupported", err)
		}
		t.Skip("the source declares no split completion")
	}
	fast := writeCommitted(t, h, event("fast", 1))
	slow := writeCommitted(t, h, event("slow", 1), event("slow", 2))
	fast = append(fast, writeCommitted(t, h, event("fast", 2))...)
	c := claimN(t, s, 4, nil)
	if len(c.Rows()) != 4 {
		t.Fatalf("claimed %d rows, want 4", len(c.Rows()))
	}
	settler, ok := c.(outboxdriver.Settler)
	if !ok {
		t.Fatal("the source declares Split: its claims must be Settlers")
	}
	complete(t, c, &outboxdriver.CompleteParams{Published: fast})

	skip := &outboxdriver.ClaimParams{Limit: 10, Skip: []outboxdriver.Aggregate{{Type: "order", ID: "slow"}}}
	later := writeCommitted(t, h, event("slow", 3), event("other", 1))
	o := claimN(t, s, 1, skip)
	if got := ids(o.Rows()); fmt.Sprint(got) != fmt.Sprint(later[1:]) {
		t.Fatalf("a claim skipping the aggregate in flight took %v; want only %v", got, later[1:])
	}
	complete(t, o, &outboxdriver.CompleteParams{Published: later[1:]})

	// The slow aggregate's answers: its first event acknowledged, its second refused.
	refused := outboxdriver.Failure{ID: slow[1], Error: "refused", CountAttempt: true, RetryAt: time.Now().Add(time.Hour)}
	if err := settler.Settle(ctx, &outboxdriver.CompleteParams{Published: slow[:1], Failed: []outboxdriver.Failure{refused}}); err != nil {
		t.Fatalf("settle: %v", err)
	}
	// A second settle finds the refused row changed since the claim: untouched.
	if err := settler.Settle(ctx, &outboxdriver.CompleteParams{Published: slow[1:]}); err != nil {
		t.Fatalf("settle again: %v", err)
	}
	if s.stream {
		// A stream keeps a refusal in memory, not on the row: the refused event and
		// what follows it wait (for its retry time), the acknowledged one is done.
		quiet(t, s)
		return
	}
	ev, err := s.admin.Event(ctx, slow[1])
	if err != nil || ev.State != outboxdriver.EventWaiting || ev.Attempts != 1 || ev.Error != "refused" {
		t.Fatalf("the refused event: %+v, %v; want waiting, one attempt, its error", ev, err)
	}
	if ev, err := s.admin.Event(ctx, slow[0]); err != nil || ev.State != outboxdriver.EventPublished {
		t.Fatalf("the acknowledged event: %+v, %v; want published", ev, err)
	}
	quiet(t, s) // slow's third event waits behind its failing second
}
