package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxd/outbox/broker"
	"github.com/outboxd/outbox/outboxdriver"
)

// A broker with a ledger (broker.Ledger), as Kafka's transactions make one: some runs
// of TestSimulation publish through it, and then no event may reach the broker twice.
// A batch's messages are staged, then a commit call through the world's gate appends
// them to the broker's log with the batch's progress, or nothing: a commit refused,
// late (it may land after its caller gave up), hung, or whose answer is lost. Every
// resume bumps the ledger's epoch; a commit made under an older epoch lands nothing
// (the broker fences it), as Kafka's producer epochs do.

// simLedger is the broker's side: the epoch and the last committed progress.
type simLedger struct {
	epoch    int
	progress []string
}

// simLedgerBroker is one process's publisher on the ledger.
type simLedgerBroker struct {
	b *simBroker

	mu      sync.Mutex
	epoch   int   // this publisher's, since its last resume (0: none)
	ready   error // nil once resumed; why it may not publish otherwise
	pending map[string]bool
}

var _ broker.Ledger = (*simLedgerBroker)(nil)

func newSimLedgerBroker(b *simBroker) *simLedgerBroker {
	return &simLedgerBroker{b: b, pending: map[string]bool{}, ready: fmt.Errorf("%w: not resumed", broker.ErrFenced)}
}

func (l *simLedgerBroker) Resume(ctx context.Context) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, p := l.b.w, l.b.p
	var (
		epoch int
		ids   []string
	)
	err := w.call(ctx, p, "resume", "", true, func(ctx context.Context) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.ledger.epoch++
		epoch, ids = w.ledger.epoch, append([]string(nil), w.ledger.progress...)
		return nil
	})
	if err != nil {
		l.ready = broker.Unavailable(fmt.Errorf("%w: the last resume failed: %w", broker.ErrFenced, err))
		return nil, err
	}
	l.epoch, l.ready = epoch, nil
	clear(l.pending)
	for _, id := range ids {
		l.pending[id] = true
	}
	w.detail("p%d resumed at epoch %d with %d ids", p.id, epoch, len(ids))
	if len(ids) > 0 {
		w.reach("ledger-resume-marks")
	}
	return ids, nil
}

func (l *simLedgerBroker) Marked(ids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.pending, id)
	}
}

func (l *simLedgerBroker) Publish(ctx context.Context, msgs []broker.Message) []broker.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ready != nil {
		return broker.AllUnavailable(len(msgs), l.ready)
	}
	results := make([]broker.Result, len(msgs))
	var (
		send []broker.Message
		idx  []int
	)
	for i := range msgs {
		if !l.pending[msgs[i].ID] {
			send, idx = append(send, msgs[i]), append(idx, i)
		}
	}
	if len(send) == 0 {
		return results
	}
	var staged []simTaken
	res := l.b.publish(ctx, send, &staged)
	sent := map[string]bool{}
	for _, m := range staged {
		sent[m.id] = true
	}
	failed := false
	for j, r := range res {
		results[idx[j]] = r
		failed = failed || r.Err != nil && sent[send[j].ID]
	}
	if failed { // the transaction is aborted: nothing of it lands
		for j := range res {
			if results[idx[j]].Err == nil {
				results[idx[j]].Err = fmt.Errorf("%w: its transaction was aborted", broker.ErrHeldBack)
			}
		}
		return results
	}
	progress := make([]string, 0, len(l.pending)+len(send))
	for id := range l.pending {
		progress = append(progress, id)
	}
	var committed []string
	for j := range send {
		if res[j].Err == nil {
			committed = append(committed, send[j].ID)
		}
	}
	if len(committed) == 0 {
		return results
	}
	progress = append(progress, committed...)
	w, p, epoch := l.b.w, l.b.p, l.epoch
	err := w.call(ctx, p, "commit", fmt.Sprintf("%s #%d", shortID(send[0].ID), len(send)), true, func(ctx context.Context) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.ledger.epoch != epoch {
			w.reached["ledger-fenced"]++
			return errors.New("sim: fenced by a newer epoch")
		}
		for _, m := range staged {
			m.at = time.Now()
			w.taken = append(w.taken, m)
		}
		w.ledger.progress = progress
		return nil
	})
	if err != nil {
		l.ready = broker.Unavailable(fmt.Errorf("%w: the commit: %w", broker.ErrFenced, err))
		for _, i := range idx {
			if results[i].Err == nil {
				results[i].Err = l.ready
			}
		}
		return results
	}
	for _, id := range committed {
		l.pending[id] = true
	}
	return results
}

func (l *simLedgerBroker) Features() broker.Features { return l.b.Features() }
func (l *simLedgerBroker) Close() error              { return nil }

// CompletePublished implements outboxdriver.Completer through the gate: a ledger's
// resume marks what the broker holds.
func (s *simStore) CompletePublished(ctx context.Context, ids []string, c outboxdriver.Completion) error {
	return s.w.call(ctx, s.p, "complete-published", fmt.Sprintf("#%d", len(ids)), true, func(ctx context.Context) error {
		return s.inner.(outboxdriver.Completer).CompletePublished(ctx, ids, c)
	})
}
