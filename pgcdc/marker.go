package pgcdc

import (
	"context"
	"sync"
	"time"

	"github.com/outboxd/outbox/internal/failpoint"
	"github.com/outboxd/outbox/outboxdriver"
)

// marker completes in the table the rows whose events the broker acknowledged (marks,
// deletes or archives them, as the relay's completion says), so `outbox status`, the
// oldest-unpublished alert, `outbox cleanup`, a polling relay taking over and the
// recovery of a lost slot all see them published. Table-less events have no row and
// skip it.
//
// It runs beside the relay, a batch at a time, so the publish path never waits for
// it. An event is reported done to the queue (and its position becomes confirmable)
// only once its row is completed: a crash in between sends the event again (at
// least once) and completes its row then, instead of leaving a published row
// unmarked for ever.
type marker struct {
	ss *session

	mu         sync.Mutex
	pending    []*entry
	completion outboxdriver.Completion
	completed  func(ids []string) // told the ids once completed (CompleteParams.Completed)
	wake       chan struct{}
	flushing   sync.Mutex // one batch at a time: the loop's, or Release's last one
}

// markBatchMax bounds the ids of one completing statement.
const markBatchMax = 5000

// markLinger is how long the marker lets acknowledged rows gather before a statement
// that would complete only a few: at a live rate each batch holds a handful of events,
// and one statement per batch was a sixth of the relay's CPU (docs/benchmarks.md). The
// publish path never waits for it; the slot's position and `outbox status` see the
// rows this much later, and a crash in between sends them again.
const markLinger = 5 * time.Millisecond

func newMarker(ss *session) *marker {
	return &marker{ss: ss, wake: make(chan struct{}, 1)}
}

// add queues acknowledged rows, to be completed with c; completed (if set) is told
// once they are.
func (m *marker) add(es []*entry, c outboxdriver.Completion, completed func(ids []string)) {
	if len(es) == 0 {
		return
	}
	m.mu.Lock()
	m.pending = append(m.pending, es...)
	m.completion, m.completed = c, completed
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run completes the queued rows until ctx ends. A failing statement (the database
// away) is retried: the rows stay unconfirmed meanwhile, never lost.
func (m *marker) run(ctx context.Context) {
	for {
		select {
		case <-m.wake:
		case <-ctx.Done():
			return
		}
		if m.queued() < markBatchMax {
			t := time.NewTimer(markLinger)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
			more, err := m.flush(ctx)
			if err == nil && !more {
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				m.ss.src.log.Warn("pgcdc: could not mark published rows; their position waits", "err", err, "retry_in", wait)
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
		}
	}
}

// queued is how many acknowledged rows wait to be completed.
func (m *marker) queued() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending)
}

// flush completes one batch of the queued rows and reports them done. more says
// rows are left.
func (m *marker) flush(ctx context.Context) (more bool, err error) {
	m.flushing.Lock()
	defer m.flushing.Unlock()
	m.mu.Lock()
	n := min(len(m.pending), markBatchMax)
	batch := m.pending[:n:n]
	c, completed := m.completion, m.completed
	m.mu.Unlock()
	if n == 0 {
		return false, nil
	}
	ids := make([]string, n)
	xids := make([]uint32, n)
	for i, e := range batch {
		ids[i], xids[i] = e.row.ID, e.xid
	}
	// The rows' transactions reached the stream before other sessions can see them.
	if err := m.ss.src.waitVisible(ctx, xids); err != nil {
		return true, err
	}
	if err := m.ss.src.completer.CompletePublished(ctx, ids, c); err != nil {
		return true, err
	}
	if completed != nil {
		completed(ids)
	}
	failpoint.Hit(failpoint.WALAfterMark)
	m.mu.Lock()
	m.pending = m.pending[n:]
	more = len(m.pending) > 0
	m.mu.Unlock()
	m.ss.q.done(batch)
	if err := m.ss.t.st.sendStatus(false); err != nil {
		m.ss.src.log.Warn("pgcdc: could not report the confirmed position", "err", err)
	}
	return more, nil
}

// drain completes what is queued before the session ends (a graceful stop sends
// nothing twice), until ctx ends.
func (m *marker) drain(ctx context.Context) {
	for {
		more, err := m.flush(ctx)
		if err != nil || !more {
			return
		}
	}
}
