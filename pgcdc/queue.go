package pgcdc

import (
	"slices"
	"sync"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// ledger numbers the events of one replication stream in stream order and works
// out which WAL position may be confirmed: a checkpoint (a commit's end, or a
// keepalive's position between transactions) is confirmable once every event
// numbered before it is done: acknowledged by the broker, or safely in the dead
// letters. It also bounds the events (and payload bytes) read and not yet done.
// One stream has one ledger, whatever the number of tables it carries.
type ledger struct {
	mu       sync.Mutex
	space    *sync.Cond // signalled when an event is done
	capacity int        // most events not yet done
	maxBytes int        // most payload bytes not yet done (0: no bound); one event always fits

	positions     // reached: the latest confirmable position
	open      int // events not yet done
	openBytes int // their payloads' bytes
	closed    bool
}

// positions numbers events in order and tells the latest checkpoint reached: one
// before which every event is done, whatever order they finish in. The ledger keeps
// the stream's (what may be confirmed), each queue its table's own.
type positions struct {
	next        uint64              // the next event's index
	doneUpTo    uint64              // every index below is done
	doneAbove   map[uint64]struct{} // done indexes at or above doneUpTo
	checkpoints []checkpoint        // in order; popped when reached
	reached     uint64              // the latest checkpoint's position reached
}

// checkpoint records lsn as reached once every event numbered so far is done.
func (p *positions) checkpoint(lsn uint64) {
	if n := len(p.checkpoints); n > 0 && p.checkpoints[n-1].idx == p.next {
		p.checkpoints[n-1].lsn = max(p.checkpoints[n-1].lsn, lsn)
	} else {
		p.checkpoints = append(p.checkpoints, checkpoint{idx: p.next, lsn: lsn})
	}
	p.advance()
}

// finish records the event numbered idx as done.
func (p *positions) finish(idx uint64) {
	if p.doneAbove == nil {
		p.doneAbove = map[uint64]struct{}{}
	}
	p.doneAbove[idx] = struct{}{}
	for {
		if _, ok := p.doneAbove[p.doneUpTo]; !ok {
			break
		}
		delete(p.doneAbove, p.doneUpTo)
		p.doneUpTo++
	}
}

func (p *positions) advance() {
	n := 0
	for n < len(p.checkpoints) && p.checkpoints[n].idx <= p.doneUpTo {
		p.reached = max(p.reached, p.checkpoints[n].lsn)
		n++
	}
	p.checkpoints = p.checkpoints[n:]
}

// queue holds one table's events read from the stream until the broker acknowledged
// them, in stream order, and hands them out so that no aggregate's event overtakes
// an earlier one. It and its ledger are the whole of the CDC relay's ordering and
// safety logic, kept apart from I/O so they are tested directly. A stream that
// carries several tables (Shared) has a queue per table on one ledger.
type queue struct {
	*ledger

	pmu     sync.Mutex
	pending []*entry // waiting to be claimed, in index order
	gone    bool     // dropped: events given back count as done
	// own numbers the table's events in its own order: how far they are done (on a
	// stream of many tables it runs ahead of the stream's position, held back by
	// the slowest table, and is what the table records as done_lsn, so that a
	// stream read again after a crash skips what it had already sent).
	own   positions
	open  int // the table's events not yet done
	bytes int // their payloads' bytes
	// parked (Shared): the table held the stream's room without progress; its
	// later events are skipped until the stream is read again (drained is called
	// once nothing of it is open), and its open ones no longer count in the ledger.
	parked  bool
	drained func()

	avail chan struct{} // a non-blocking "there is something to claim" hint
}

type entry struct {
	idx         uint64
	own         uint64 // the index in its table's own order (queue.own)
	row         outboxdriver.Row
	availableAt time.Time
	reject      error  // goes to the dead letters instead of the broker
	xid         uint32 // the transaction that wrote it (0: none), see waitVisible
	commitLSN   uint64 // where that transaction committed (0: unknown), see session.resent
	inserted    bool   // a row of the table, completed there once published (marker)
	// failed: the broker did not take it; until its retry time its aggregate's later
	// events wait behind it. An event only delayed (NotBefore) holds nothing back.
	failed bool
}

type checkpoint struct {
	idx uint64 // confirmable once doneUpTo >= idx
	lsn uint64
}

func newLedger(capacity, maxBytes int) *ledger {
	l := &ledger{capacity: capacity, maxBytes: maxBytes}
	l.space = sync.NewCond(&l.mu)
	return l
}

// newQueue returns a queue on a ledger of its own (a stream of one table).
func newQueue(capacity, maxBytes int) *queue {
	return newTableQueue(newLedger(capacity, maxBytes))
}

// newTableQueue returns a queue of one table on a stream's ledger.
func newTableQueue(l *ledger) *queue {
	return &queue{ledger: l, avail: make(chan struct{}, 1)}
}

// waitSpace blocks until an event may be added or deadline passes (so the reader
// can still send status updates while the relay is behind). It reports whether there
// is space.
func (l *ledger) waitSpace(deadline time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hasSpace() {
		return true
	}
	t := time.AfterFunc(time.Until(deadline), func() {
		l.mu.Lock()
		l.space.Broadcast()
		l.mu.Unlock()
	})
	defer t.Stop()
	for !l.hasSpace() && time.Now().Before(deadline) {
		l.space.Wait()
	}
	return l.hasSpace()
}

// minOpenEvents is how many events may always be open, whatever their bytes: a few
// huge events waiting for a retry must not stop the stream, and so every other
// aggregate (a failure belongs to its message). Memory stays under maxBytes plus this
// many events.
const minOpenEvents = 100

// hasSpace reports whether another event may be read: fewer than capacity events and
// maxBytes of payload wait, or fewer than minOpenEvents whatever their size. Called
// with mu held.
func (l *ledger) hasSpace() bool {
	if l.closed || l.open < min(minOpenEvents, l.capacity) {
		return true
	}
	return l.open < l.capacity && (l.maxBytes <= 0 || l.openBytes < l.maxBytes)
}

// push adds an event read from the stream. One reader pushes, so each queue stays in
// index order.
func (q *queue) push(ch *Change) {
	idx := q.number(len(ch.Row.Payload))
	q.pmu.Lock()
	q.pending = append(q.pending, &entry{idx: idx, own: q.own.next, row: ch.Row, availableAt: ch.AvailableAt, reject: ch.Reject,
		xid: ch.Xid, commitLSN: ch.CommitLSN, inserted: ch.Inserted})
	q.own.next++
	q.open++
	q.bytes += len(ch.Row.Payload)
	q.pmu.Unlock()
	q.hint()
}

// park skips the table's later events and takes its open ones out of the ledger's
// count, so the stream reads on for the other tables; drained is called once
// nothing of it is open (at once if nothing is).
func (q *queue) park(drained func()) {
	q.pmu.Lock()
	if q.parked {
		q.pmu.Unlock()
		return
	}
	q.parked, q.drained = true, drained
	n, b := q.open, q.bytes
	q.pmu.Unlock()
	q.forgive(n, b)
	if n == 0 {
		drained()
	}
}

func (q *queue) isParked() bool {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.parked
}

// ownDoneCount is how many of the table's events are done in its own order (what
// shows it progressing).
func (q *queue) ownDoneCount() uint64 {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.own.doneUpTo
}

// openEvents is how many of the table's events are not done yet.
func (q *queue) openEvents() int {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.open
}

// committed records that the transaction committed at lsn, which pushed events
// into this queue, is whole: once they are done, so is lsn for this table.
func (q *queue) committed(lsn uint64) {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	if q.parked {
		return // its events of that transaction may have been skipped
	}
	q.own.checkpoint(lsn)
}

// ownDone is the latest commit position at or before which every event of this
// table is done (0: none yet).
func (q *queue) ownDone() uint64 {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return q.own.reached
}

// done records the queue's events as finished, for the table and for the stream.
func (q *queue) done(es []*entry) {
	if len(es) == 0 {
		return
	}
	q.pmu.Lock()
	for _, e := range es {
		q.own.finish(e.own)
		q.bytes -= len(e.row.Payload)
	}
	q.own.advance()
	q.open -= len(es)
	parked := q.parked
	var drained func()
	if parked && q.open == 0 {
		drained, q.drained = q.drained, nil
	}
	q.pmu.Unlock()
	q.finishAll(es, !parked)
	if drained != nil {
		drained()
	}
}

// number gives the next event its index, counting it open.
func (l *ledger) number(payload int) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	idx := l.next
	l.next++
	l.open++
	l.openBytes += payload
	return idx
}

// mark records a position that may be confirmed once every event pushed before it
// is done.
func (l *ledger) mark(lsn uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkpoint(lsn)
}

// confirmedLSN is the latest position whose events are all done (0: none yet).
func (l *ledger) confirmedLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reached
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
	q.pmu.Lock()
	defer q.pmu.Unlock()
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
	q.pmu.Lock()
	if q.gone {
		q.pmu.Unlock()
		q.done(es)
		return
	}
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
	q.pmu.Unlock()
	q.hint()
}

// finishAll records events as finished (acknowledged, or in the dead letters);
// counted says they still count as open (a parked table's were taken out of the
// count already).
func (l *ledger) finishAll(es []*entry, counted bool) {
	if len(es) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range es {
		l.finish(e.idx)
		if counted {
			l.openBytes -= len(e.row.Payload)
		}
	}
	if counted {
		l.open -= len(es)
	}
	l.advance()
	l.space.Broadcast()
}

// forgive takes n open events (of bytes payload) out of the count: a parked
// table's, which no longer hold the stream's room.
func (l *ledger) forgive(n, bytes int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open -= n
	l.openBytes -= bytes
	l.space.Broadcast()
}

// hold numbers a placeholder that is never done: no position at or after it is
// confirmed (a parked table's skipped events come after it).
func (l *ledger) hold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
}

// close wakes a reader waiting for space: the stream is going away.
func (l *ledger) close() {
	l.mu.Lock()
	l.closed = true
	l.space.Broadcast()
	l.mu.Unlock()
}

// drop takes every event out of the queue and counts them as done (and those
// claimed, once given back): the table left the stream (dropped, or no longer
// relayed here), so its events must not hold the confirmed position back. A
// rows-mode table keeps its unpublished rows; the backfill of its next start
// publishes them.
func (q *queue) drop() {
	q.pmu.Lock()
	es := q.pending
	q.pending, q.gone = nil, true
	q.pmu.Unlock()
	q.done(es)
}

func aggregateKey(r *outboxdriver.Row) string {
	return outboxdriver.AggregateKey(r.AggregateType, r.AggregateID)
}
