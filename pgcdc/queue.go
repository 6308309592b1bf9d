package pgcdc

import (
	"slices"
	"sync"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// queue holds the events read from the stream until the broker acknowledged them,
// and works out which WAL position may be confirmed. It is the whole of the CDC
// relay's ordering and safety logic, kept apart from I/O so it is tested directly.
//
// Every event gets an index in stream order. A checkpoint (a commit's end, or a
// keepalive's position between transactions) is confirmable once every event indexed
// before it is done: acknowledged by the broker, or safely in the dead letters.
type queue struct {
	mu       sync.Mutex
	space    *sync.Cond // signalled when an event is done
	capacity int        // most events not yet done
	maxBytes int        // most payload bytes not yet done (0: no bound); one event always fits

	pending     []*entry // waiting to be claimed, in index order
	nextIdx     uint64
	doneUpTo    uint64              // every index below is done
	doneAbove   map[uint64]struct{} // done indexes at or above doneUpTo
	checkpoints []checkpoint        // in order; popped when confirmable
	confirmed   uint64              // the latest confirmable position
	open        int                 // events not yet done
	openBytes   int                 // their payloads' bytes
	closed      bool

	avail chan struct{} // a non-blocking "there is something to claim" hint
}

type entry struct {
	idx         uint64
	row         outboxdriver.Row
	availableAt time.Time
	reject      error  // goes to the dead letters instead of the broker
	xid         uint32 // the transaction that wrote it (0: none), see waitVisible
	inserted    bool   // a row of the table, completed there once published (marker)
	// failed: the broker did not take it; until its retry time its aggregate's later
	// events wait behind it. An event only delayed (NotBefore) holds nothing back.
	failed bool
}

type checkpoint struct {
	idx uint64 // confirmable once doneUpTo >= idx
	lsn uint64
}

func newQueue(capacity, maxBytes int) *queue {
	q := &queue{capacity: capacity, maxBytes: maxBytes, doneAbove: map[uint64]struct{}{}, avail: make(chan struct{}, 1)}
	q.space = sync.NewCond(&q.mu)
	return q
}

// waitSpace blocks until an event may be added or deadline passes (so the reader
// can still send status updates while the relay is behind). It reports whether there
// is space.
func (q *queue) waitSpace(deadline time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.hasSpace() {
		return true
	}
	t := time.AfterFunc(time.Until(deadline), func() {
		q.mu.Lock()
		q.space.Broadcast()
		q.mu.Unlock()
	})
	defer t.Stop()
	for !q.hasSpace() && time.Now().Before(deadline) {
		q.space.Wait()
	}
	return q.hasSpace()
}

// minOpenEvents is how many events may always be open, whatever their bytes: a few
// huge events waiting for a retry must not stop the stream, and so every other
// aggregate (a failure belongs to its message). Memory stays under maxBytes plus this
// many events.
const minOpenEvents = 100

// hasSpace reports whether another event may be read: fewer than capacity events and
// maxBytes of payload wait, or fewer than minOpenEvents whatever their size. Called
// with mu held.
func (q *queue) hasSpace() bool {
	if q.closed || q.open < min(minOpenEvents, q.capacity) {
		return true
	}
	return q.open < q.capacity && (q.maxBytes <= 0 || q.openBytes < q.maxBytes)
}

// push adds an event read from the stream, written by transaction xid (a row of the
// table when inserted).
func (q *queue) push(row outboxdriver.Row, availableAt time.Time, reject error, xid uint32, inserted bool) {
	q.mu.Lock()
	q.pending = append(q.pending, &entry{idx: q.nextIdx, row: row, availableAt: availableAt, reject: reject, xid: xid, inserted: inserted})
	q.nextIdx++
	q.open++
	q.openBytes += len(row.Payload)
	q.mu.Unlock()
	q.hint()
}

// mark records a position that may be confirmed once every event pushed before it
// is done.
func (q *queue) mark(lsn uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.checkpoints); n > 0 && q.checkpoints[n-1].idx == q.nextIdx {
		q.checkpoints[n-1].lsn = max(q.checkpoints[n-1].lsn, lsn)
	} else {
		q.checkpoints = append(q.checkpoints, checkpoint{idx: q.nextIdx, lsn: lsn})
	}
	q.advance()
}

// confirmedLSN is the latest position whose events are all done (0: none yet).
func (q *queue) confirmedLSN() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.confirmed
}

func (q *queue) hint() {
	select {
	case q.avail <- struct{}{}:
	default:
	}
}

// take removes up to limit claimable events, ending once their payloads reach
// maxBytes (0: no bound; the first is always taken): due, of no aggregate with an
// earlier event still waiting, in order. blocked reports aggregates the caller holds
// (dead letters); their events are returned apart, in held, for the caller to
// deadLetter.
func (q *queue) take(limit, maxBytes int, now time.Time, blocked func(key string) bool) (out, held []*entry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var waiting map[string]bool // aggregates with an earlier event left waiting
	keep := q.pending[:0]
	bytes := 0
	for i, e := range q.pending {
		if len(out)+len(held) >= limit || maxBytes > 0 && bytes >= maxBytes {
			keep = append(keep, q.pending[i:]...)
			break
		}
		key := aggregateKey(&e.row)
		switch {
		case e.reject != nil:
			held = append(held, e) // never sent; dead letters at once
		case waiting[key] || e.failed && e.availableAt.After(now):
			if waiting == nil {
				waiting = map[string]bool{}
			}
			waiting[key] = true
			keep = append(keep, e)
		case e.availableAt.After(now): // delayed: due later, ordered by when it is due
			keep = append(keep, e)
		case blocked != nil && blocked(key):
			held = append(held, e)
		default:
			out = append(out, e)
			bytes += len(e.row.Payload)
		}
	}
	clear(q.pending[len(keep):])
	q.pending = keep
	return out, held
}

// giveBack returns events to the queue (a released claim, or failed events with a
// later availableAt), keeping index order.
func (q *queue) giveBack(es []*entry) {
	if len(es) == 0 {
		return
	}
	q.mu.Lock()
	q.pending = append(q.pending, es...)
	slices.SortFunc(q.pending, func(a, b *entry) int {
		switch {
		case a.idx < b.idx:
			return -1
		case a.idx > b.idx:
			return 1
		}
		return 0
	})
	q.mu.Unlock()
	q.hint()
}

// done records events as finished (acknowledged, or in the dead letters).
func (q *queue) done(es []*entry) {
	if len(es) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, e := range es {
		q.doneAbove[e.idx] = struct{}{}
	}
	q.open -= len(es)
	for _, e := range es {
		q.openBytes -= len(e.row.Payload)
	}
	for {
		if _, ok := q.doneAbove[q.doneUpTo]; !ok {
			break
		}
		delete(q.doneAbove, q.doneUpTo)
		q.doneUpTo++
	}
	q.advance()
	q.space.Broadcast()
}

func (q *queue) advance() {
	n := 0
	for n < len(q.checkpoints) && q.checkpoints[n].idx <= q.doneUpTo {
		q.confirmed = max(q.confirmed, q.checkpoints[n].lsn)
		n++
	}
	q.checkpoints = q.checkpoints[n:]
}

// close wakes a reader waiting for space: the stream is going away.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.space.Broadcast()
	q.mu.Unlock()
}

func aggregateKey(r *outboxdriver.Row) string {
	return outboxdriver.AggregateKey(r.AggregateType, r.AggregateID)
}
