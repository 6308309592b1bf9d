package outboxdrivertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// sourceCases are the cases of the seam the relay claims through: claim order and
// bounds, completion, failures and retries, holds and dead letters, delays and
// wake-ups. Run runs them on the driver's table store; RunSource on a source built
// on the driver (Harness.Source), such as the CDC source.
func sourceCases[TTx any]() []suiteCase[TTx] {
	return []suiteCase[TTx]{
		{"ClaimInWriteOrder", testClaimOrder[TTx]},
		{"ClaimBoundedByBytes", testClaimMaxBytes[TTx]},
		{"LargeWrite", testLargeWrite[TTx]},
		{"FailuresCounted", testFailures[TTx]},
		{"FailingEventBlocksItsAggregate", testFailingBlocks[TTx]},
		{"DeadLetterHoldReplay", testDeadLetterReplay[TTx]},
		{"DeadLetterFlowPurge", testDeadLetterFlowPurge[TTx]},
		{"DelayedEvents", testDelayed[TTx]},
		{"Listen", testListen[TTx]},
		{"TraceContextStored", testTraceContext[TTx]},
		{"SplitComplete", testSplitComplete[TTx]},
	}
}

type suiteCase[TTx any] struct {
	name string
	fn   func(t *testing.T, h *Harness[TTx])
}

// RunSource runs the relay's seam cases on the source Harness.Source opens on each
// case's migrated table. Rows reach such a source some time after their commit: the
// cases wait for what they expect, and check that nothing else arrives.
func RunSource[TTx any](t *testing.T, newHarness NewFunc[TTx]) {
	for _, tc := range sourceCases[TTx]() {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, outboxdriver.PayloadJSON)
			if h.Source == nil {
				t.Fatal("RunSource needs Harness.Source")
			}
			migrate(t, h)
			tc.fn(t, h)
		})
	}
}

// side is what a case claims from: the harness's source under a leadership held as
// the relay holds it, or the driver's table store; and the table's admin (status,
// dead letters).
type side struct {
	outboxdriver.Source
	admin outboxdriver.Admin
	// stream: rows arrive some time after their commit, and the source marks
	// nothing in the table (its backlog is the stream's, not the table's status).
	stream bool
}

func source[TTx any](t *testing.T, h *Harness[TTx]) side {
	t.Helper()
	st := store(t, h)
	if h.Source == nil {
		return side{Source: st, admin: st}
	}
	src := h.Source(t)
	lead, err := src.AcquireLeadership(ctxT(t), &outboxdriver.LeadershipParams{})
	if err != nil || lead == nil {
		t.Fatalf("leadership of the source: %v, %v", lead, err)
	}
	t.Cleanup(func() { _ = lead.Release(ctxT(t)) })
	return side{Source: src, admin: st, stream: true}
}

// claimN claims until the claim holds at least want rows (a stream's rows arrive
// late: a shorter claim is given back and tried again) or a minute passes, and returns it
// still held.
func claimN(t *testing.T, s side, want int, p *outboxdriver.ClaimParams) outboxdriver.Claim {
	t.Helper()
	if p == nil {
		p = &outboxdriver.ClaimParams{Limit: 1000}
	}
	// A wait for a condition, not a latency bound: a CDC source sees a row only once
	// its walsender has decoded every WAL record before it, which on a machine
	// running other suites beside this one (each writing WAL) took over 15 s once.
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := s.Claim(ctxT(t), p)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Rows()) >= want || time.Now().After(deadline) {
			return c
		}
		if err := c.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) //nolint:forbidigo // polls a claim until a stream's late rows arrive; a driver's harness has no testenv.Wait
	}
}

// drainN claims and publishes until want rows came, then checks no other row is
// claimable, and returns the rows in claim order.
func drainN(t *testing.T, s side, want int) []outboxdriver.Row {
	t.Helper()
	var all []outboxdriver.Row
	for len(all) < want {
		c := claimN(t, s, 1, &outboxdriver.ClaimParams{Limit: 100})
		rows := c.Rows()
		if len(rows) == 0 {
			t.Fatalf("claimed %d rows (%v), want %d", len(all), ids(all), want)
		}
		all = append(all, rows...)
		complete(t, c, &outboxdriver.CompleteParams{Published: ids(rows)})
	}
	quiet(t, s)
	return all
}

// quiet checks nothing is claimable (on a stream, after a moment for late rows).
func quiet(t *testing.T, s side) {
	t.Helper()
	if s.stream {
		time.Sleep(300 * time.Millisecond) //nolint:forbidigo // a stream's late rows, if any, come within it; the source gives no sign of rows it does not have
	}
	c, err := s.Claim(ctxT(t), &outboxdriver.ClaimParams{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Release(ctxT(t)) }()
	if rows := c.Rows(); len(rows) > 0 {
		t.Fatalf("claimable when nothing should be: %v", ids(rows))
	}
}

// listenable skips the case when the source declares no wake-ups (and refuses
// Listen), and fails it on any other error from Listen.
func listenable(t *testing.T, caps outboxdriver.Capabilities, err error) {
	t.Helper()
	if !caps.Listen {
		if !errors.Is(err, outboxdriver.ErrNotSupported) {
			t.Fatalf("Listen on a source that declares no wake-ups: %v, want ErrNotSupported", err)
		}
		t.Skip("driver declares no LISTEN/NOTIFY")
	}
	if err != nil {
		t.Fatal(fmt.Errorf("listen: %w", err))
	}
}
