package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// singleTerm is the single active relay's: a table lock that the database revokes
// when the relay stops proving it is alive (LeaderTimeout), kept by a heartbeat of its
// own so a slow batch never starves it. The relay fences itself by its own clock: a
// batch goes to the broker only while the last heartbeat, counted from when it was
// sent, is younger than three quarters of the bound, so the database cannot have
// ended the session (and let a standby in) before this relay stops publishing.
type singleTerm struct {
	lead  outboxdriver.Leadership
	bound time.Duration // how long the database keeps a silent leader
	every time.Duration // heartbeat period, at most bound/4

	mu         sync.Mutex
	validUntil time.Time
	err        error
}

func newSingleTerm(lead outboxdriver.Leadership, bound, every time.Duration, acquired time.Time) *singleTerm {
	if b, ok := lead.(outboxdriver.LeaseBound); ok {
		bound = b.Bound()
	}
	return &singleTerm{lead: lead, bound: bound, every: min(every, bound/4), validUntil: acquired.Add(bound * 3 / 4)}
}

// heartbeat proves the relay alive every period until ctx ends or the leadership is
// lost (then lost is called). No proof may outlast the term: a check still waiting
// when the last proof's validity ends (a dead socket, a blackholed network) is given
// up, and the relay steps down then, before the database lets a standby in, rather
// than at the next failed check, up to a period later.
func (t *singleTerm) heartbeat(ctx context.Context, log *slog.Logger, lost func()) {
	next := time.Now().Add(t.every)
	for {
		t.mu.Lock()
		expiry := t.validUntil
		t.mu.Unlock()
		wake := time.NewTimer(time.Until(earliest(next, expiry)))
		select {
		case <-ctx.Done():
			wake.Stop()
			return
		case <-wake.C:
		}
		sent := time.Now()
		next = sent.Add(t.every)
		hctx, cancel := context.WithDeadline(ctx, earliest(sent.Add(t.bound/4), expiry))
		err := t.lead.Check(hctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		t.mu.Lock()
		switch {
		case err == nil && sent.Before(t.validUntil):
			t.validUntil = sent.Add(t.bound * 3 / 4)
		case errors.Is(err, outboxdriver.ErrLeadershipLost):
			t.err = err
		case !time.Now().Before(t.validUntil):
			t.err = fmt.Errorf("%w: no heartbeat within %v (last check: %v)", outboxdriver.ErrLeadershipLost, t.bound*3/4, err) //nolint:errorlint // leadership is lost, whatever cut the connection: one sentinel to branch on
		}
		done := t.err != nil
		t.mu.Unlock()
		if err != nil {
			log.Warn("relay: leadership heartbeat failed", "err", err)
		}
		if done {
			lost()
			return
		}
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (t *singleTerm) check(context.Context, []int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}
func (t *singleTerm) interval() time.Duration { return t.every }
func (*singleTerm) drainsBeforeCheck() bool   { return false }
func (t *singleTerm) publishable([]outboxdriver.Row) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err == nil && time.Now().Before(t.validUntil)
}
func (t *singleTerm) claimParams(limit int) *outboxdriver.ClaimParams {
	return &outboxdriver.ClaimParams{Limit: limit, HoldTimeout: t.bound}
}
