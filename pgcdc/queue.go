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
	capacity int        // most events not yet done, held whole (the room)
	maxBytes int        // most payload bytes not yet done (0: no bound); one event always fits
	// maxSpilled is how many more events not yet done may be held without their
	// payloads once the room is full (0: none; a stream of several tables only). A
	// spilled event is a row of its table: its claim reads the payload from there.
	// So a quiet table's event committed after another table's transaction larger
	// than the room is read, and published, without waiting for that table's relay.
	maxSpilled int

	positions     // reached: the latest confirmable position
	open      int // events not yet done, held whole
	openBytes int // their payloads' bytes
	spilled   int // events not yet done, held without their payloads
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
	own     positions
	open    int // the table's events not yet done
	bytes   int // their payloads' bytes, of those held whole
	spilled int // of them, those held without their payloads
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
	size        int  // the payload's bytes as read from the stream
	spilled     bool // held without its payload (ledger.maxSpilled): the claim reads it from the table
	headers     bool // spilled with headers, read from the table too (a map costs more than the rest of an entry)
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

func newLedger(capacity, maxBytes, maxSpilled int) *ledger {
	l := &ledger{capacity: capacity, maxBytes: maxBytes, maxSpilled: maxSpilled}
	l.space = sync.NewCond(&l.mu)
	return l
}

// newQueue returns a queue on a ledger of its own (a stream of one table).
func newQueue(capacity, maxBytes int) *queue {
	return newTableQueue(newLedger(capacity, maxBytes, 0))
}

// newTableQueue returns a queue of one table on a stream's ledger.
func newTableQueue(l *ledger) *queue {
	return &queue{ledger: l, avail: make(chan struct{}, 1)}
}

// waitSpace blocks until an event may be added whole or deadline passes (so the
// reader can still send status updates while the relay is behind). It reports
// whether there is space.
func (l *ledger) waitSpace(deadline time.Time) bool { return l.waitFor(deadline, l.hasSpace) }

// waitRead blocks until another event may be read, whole or spilled, or deadline
// passes; it reports whether one may.
func (l *ledger) waitRead(deadline time.Time) bool { return l.waitFor(deadline, l.canRead) }

func (l *ledger) waitFor(deadline time.Time, ok func() bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok() {
		return true
	}
	t := time.AfterFunc(time.Until(deadline), func() {
		l.mu.Lock()
		l.space.Broadcast()
		l.mu.Unlock()
	})
	defer t.Stop()
	for !ok() && time.Now().Before(deadline) {
		l.space.Wait()
	}
	return ok()
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

// canRead reports whether another event may be read: there is room, or room to
// spill one (an event that cannot be spilled then waits for room, read). Called
// with mu held.
func (l *ledger) canRead() bool { return l.hasSpace() || l.spilled < l.maxSpilled }

// spillable reports whether ch's event may be held without its payload: a row of
// the table (read again from there by its claim) that is to be published.
func spillable(ch *Change) bool { return ch.Inserted && ch.Reject == nil && !ch.Row.PayloadNull }

// push adds an event read from the stream, whole if there is room, else without its
// payload if it may be spilled; it reports false, adding nothing, when neither (the
// reader waits for room). One reader pushes, so each queue stays in index order.
func (q *queue) push(ch *Change) bool {
	size := len(ch.Row.Payload)
	idx, spilled, ok := q.admit(size, spillable(ch))
	if !ok {
		return false
	}
	e := &entry{idx: idx, row: ch.Row, size: size, spilled: spilled, availableAt: ch.AvailableAt, reject: ch.Reject,
		xid: ch.Xid, commitLSN: ch.CommitLSN, inserted: ch.Inserted}
	if spilled {
		e.row.Payload = nil // the stream's buffer goes with it
		e.headers, e.row.Headers = e.row.Headers != nil, nil
	}
	q.pmu.Lock()
	e.own = q.own.next
	q.pending = append(q.pending, e)
	q.own.next++
	q.open++
	if spilled {
		q.spilled++
	} else {
		q.bytes += size
	}
	q.pmu.Unlock()
	q.hint()
	return true
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
	n, b, sp := q.open, q.bytes, q.spilled
	q.pmu.Unlock()
	q.forgive(n-sp, b, sp)
	if n == 0 {
		drained()
	}
}

// takes reports whether the table still takes events from the stream: not parked,
// not let go.
func (q *queue) takes() bool {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	return !q.parked && !q.gone
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

// holding is how many of the table's events not done hold the stream's room: those
// held whole, and the spilled ones too when spilled says the spill is full.
func (q *queue) holding(spilled bool) int {
	q.pmu.Lock()
	defer q.pmu.Unlock()
	if spilled {
		return q.open
	}
	return q.open - q.spilled
}

// spillFull reports whether no more events may be spilled.
func (l *ledger) spillFull() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.spilled >= l.maxSpilled
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
		if e.spilled {
			q.spilled--
		} else {
			q.bytes -= e.size
		}
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

// admit gives the next event its index, counting it open: whole if there is room,
// else spilled if it may be (canSpill) and there is room for that; ok is false when
// neither, and then nothing is counted.
func (l *ledger) admit(payload int, canSpill bool) (idx uint64, spilled, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.hasSpace():
		l.open++
		l.openBytes += payload
	case canSpill && l.spilled < l.maxSpilled:
		l.spilled++
		spilled = true
	default:
		return 0, false, false
	}
	idx = l.next
	l.next++
	return idx, spilled, true
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
// earlier event still waiting, in order. Events of the aggregates in skip (a slow
// key's, in flight at the broker) all stay. blocked reports aggregates the caller
// holds (dead letters); their events are returned apart, in held, for the caller to
// deadLetter.
func (q *queue) take(limit, maxBytes int, now time.Time, skip map[string]bool, blocked func(key string) bool) (out, held []*entry) {
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
		case skip[key]:
			keep = append(keep, e)
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
			bytes += e.size
		}
	}
	clear(q.pending[len(keep):])
	q.pending = keep
	return out, held
}

// giveBack returns events to the queue (a released claim, or failed events with a
// later availableAt), keeping index order. A spilled event's payload, read for its
// claim, goes again (and its headers): what waits stays within the room.
func (q *queue) giveBack(es []*entry) {
	if len(es) == 0 {
		return
	}
	for _, e := range es {
		if e.spilled {
			e.row.Payload = nil
			if e.headers {
				e.row.Headers = nil
			}
		}
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

// takeBack removes from the queue those of es still waiting in it (given back
// by a claim completed in parts, not taken since) and returns them.
func (q *queue) takeBack(es []*entry) []*entry {
	if len(es) == 0 {
		return nil
	}
	want := make(map[*entry]bool, len(es))
	for _, e := range es {
		want[e] = true
	}
	q.pmu.Lock()
	defer q.pmu.Unlock()
	var out []*entry
	keep := q.pending[:0]
	for _, e := range q.pending {
		if want[e] {
			out = append(out, e)
		} else {
			keep = append(keep, e)
		}
	}
	clear(q.pending[len(keep):])
	q.pending = keep
	return out
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
		switch {
		case !counted:
		case e.spilled:
			l.spilled--
		default:
			l.open--
			l.openBytes -= e.size
		}
	}
	l.advance()
	l.space.Broadcast()
}

// forgive takes n open events (of bytes payload) and spilled ones out of the
// count: a parked table's, which no longer hold the stream's room.
func (l *ledger) forgive(n, bytes, spilled int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open -= n
	l.openBytes -= bytes
	l.spilled -= spilled
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
