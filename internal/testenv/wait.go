package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// WaitTimeoutDefault bounds Wait when ctx has no deadline of its own.
const WaitTimeoutDefault = 60 * time.Second

// Wait is the one way tests wait: it calls cond until it reports true, polling
// quickly at first and then every 50 ms, and fails t with what it was waiting for
// if ctx ends (or WaitTimeoutDefault passes) first. cond may fail t itself.
func Wait(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	WaitTell(t, ctx, what, cond, nil)
}

// WaitTell is Wait whose failure also tells what tell returns then (the output of
// the process under test, the last response).
func WaitTell(t testing.TB, ctx context.Context, what string, cond func() bool, tell func() string) {
	t.Helper()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, WaitTimeoutDefault)
		defer cancel()
	}
	for d := time.Millisecond; ; d = min(2*d, 50*time.Millisecond) {
		if cond() {
			return
		}
		select {
		case <-ctx.Done():
			if tell != nil {
				t.Fatalf("gave up waiting for %s: %v\n%s", what, ctx.Err(), tell())
			}
			t.Fatalf("gave up waiting for %s: %v", what, ctx.Err())
		case <-time.After(d):
		}
	}
}

// WaitTurns waits until count, a counter of turns of the loop under test (a relay's
// Stats().Claims), has gone up by n from its value now. It is how a test shows an
// absence: something that did not happen in n turns, each of which would have done
// it, did not happen, on a machine of any speed (where a sleep only hopes it was
// long enough).
func WaitTurns(t testing.TB, ctx context.Context, what string, n int64, count func() int64) {
	t.Helper()
	from := count()
	Wait(t, ctx, fmt.Sprintf("%d turns of %s", n, what), func() bool { return count() >= from+n })
}
