// Package simpg is a model of PostgreSQL as the outbox's PostgreSQL store uses it, in
// memory, for the relay's deterministic simulation: sessions and transactions, rows
// visible once their transaction commits (a sequence number is drawn at insert, so
// writers can commit opposite to their inserts), row locks of PostgreSQL's four
// strengths with waits and SKIP LOCKED, advisory locks (session and transaction level,
// shared and exclusive, with waiters queued as PostgreSQL queues them), lock_timeout,
// idle_in_transaction_session_timeout and idle_session_timeout enforced by the
// server's clock, and a process whose connections die at once when it crashes.
//
// Its store (Driver.Store) runs the statements of the real PostgreSQL store
// (outboxdriver/internal/pgsql) as Go over this model, step for step: the claim fence,
// the head rule (outboxdriver.ClaimHeads), the hold timeout, the settle fallback, the
// leadership lock and its wait for old claims, a group's leases with epochs, fenced
// write-backs and the barrier. It passes the driver suite (outboxdrivertest), which is
// what makes it a model of the store rather than a mock. What it leaves out is in
// docs/testing.md: no WAL (the CDC relay), no MVCC snapshots longer than a statement,
// no deadlock detection, no vacuum, no daily partitions.
//
// Time is time.Now: inside a testing/synctest bubble, the bubble's virtual clock.
package simpg

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Errors a statement fails with, as PostgreSQL would.
var (
	// ErrSessionEnded: the server ended the session (a timeout, the process died).
	ErrSessionEnded = errors.New("simpg: the session was terminated by the server")
	// ErrLockTimeout: lock_timeout passed while waiting for a lock (SQLSTATE 55P03).
	ErrLockTimeout = errors.New("simpg: canceling statement due to lock timeout")
	errTxDone      = errors.New("simpg: the transaction has ended")
)

// DB is one database server: every process's connections share it.
type DB struct {
	mu       sync.Mutex
	tables   map[string]*table
	sessions []*session
	nextID   int
	advisory map[int64]*advisoryLock
	// changed is closed, and replaced, whenever a lock is released or a transaction
	// ends: waiters look again.
	changed chan struct{}
	// counts are what the server did that a simulation wants reached (Counts).
	counts map[string]int
}

// Counts reports how often the server did what tests want to see done: ended a
// transaction idle past its timeout ("idle-in-transaction-ended"), a session idle
// past idle_session_timeout ("idle-session-ended"), made a statement wait for a lock
// ("lock-waited"), or gave up on one at lock_timeout ("lock-timeout"); and how often a
// new leader waited for claims still holding the claim fence
// ("leader-waited-for-claims"), and a barrier for a row another claim held
// ("barrier-waited").
func (db *DB) Counts() map[string]int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return maps.Clone(db.counts)
}

// NewDB is an empty database server.
func NewDB() *DB {
	return &DB{tables: map[string]*table{}, advisory: map[int64]*advisoryLock{}, changed: make(chan struct{}), counts: map[string]int{}}
}

// Client is one process's connections to the database: Close ends them all at once,
// as the kernel does when the process dies.
type Client struct {
	db     *DB
	closed bool
}

// Client opens a process's handle.
func (db *DB) Client() *Client { return &Client{db: db} }

// Close ends every session of the client: their transactions roll back and their
// locks go at once.
func (c *Client) Close() {
	db := c.db
	db.mu.Lock()
	defer db.mu.Unlock()
	c.closed = true
	for _, s := range slices.Clone(db.sessions) {
		if s.client == c {
			db.terminate(s)
		}
	}
}

// session is one connection's server process.
type session struct {
	id     int
	client *Client
	closed bool
	// last is when the session last ran a statement; busy while a statement waits.
	last time.Time
	busy bool
	// idleSession is idle_session_timeout (0: none): the session ends after that
	// long without a statement outside a transaction.
	idleSession time.Duration
	started     time.Time
	tx          *Tx
}

// Tx is a transaction on a session of its own.
type Tx struct {
	db    *DB
	s     *session
	start time.Time // now() in the transaction
	done  bool
	// idleTimeout is idle_in_transaction_session_timeout (0: none), lockTimeout
	// lock_timeout (0: none).
	idleTimeout, lockTimeout time.Duration
	writes                   []*row // rows with a version of this transaction
	locked                   []*row // rows this transaction holds a lock on
	notify                   []*table
}

// open starts a session for c (under db.mu).
func (db *DB) open(c *Client) (*session, error) {
	if c.closed {
		return nil, ErrSessionEnded
	}
	db.nextID++
	s := &session{id: db.nextID, client: c, last: time.Now(), started: time.Now()}
	db.sessions = append(db.sessions, s)
	return s, nil
}

// begin starts a transaction on a new session of c.
func (db *DB) begin(ctx context.Context, c *Client) (*Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	db.reap()
	s, err := db.open(c)
	if err != nil {
		return nil, err
	}
	tx := &Tx{db: db, s: s, start: now()}
	s.tx = tx
	return tx, nil
}

// now is the server's clock, to PostgreSQL's microsecond.
func now() time.Time { return time.Now().Truncate(time.Microsecond) }

// terminate ends session s: its transaction rolls back, its locks go (under db.mu).
func (db *DB) terminate(s *session) {
	if s.closed {
		return
	}
	s.closed = true
	if s.tx != nil {
		db.endTx(s.tx, false)
	}
	for key, l := range db.advisory {
		l.holds = slices.DeleteFunc(l.holds, func(h advisoryHold) bool { return h.s == s })
		if len(l.holds) == 0 && len(l.waiting) == 0 {
			delete(db.advisory, key)
		}
	}
	db.sessions = slices.DeleteFunc(db.sessions, func(x *session) bool { return x == s })
	db.broadcast()
}

func (db *DB) broadcast() {
	close(db.changed)
	db.changed = make(chan struct{})
}

// reap ends the sessions the server's timeouts end by now (under db.mu): a
// transaction idle past idle_in_transaction_session_timeout, a session idle past
// idle_session_timeout. The server does it on its clock; the model, whenever it is
// asked anything, and waiters wake for it (nextReap).
func (db *DB) reap() {
	t := time.Now()
	for _, s := range slices.Clone(db.sessions) {
		if at, ok := s.reapAt(); ok && !t.Before(at) {
			if s.tx != nil {
				db.counts["idle-in-transaction-ended"]++
			} else {
				db.counts["idle-session-ended"]++
			}
			db.terminate(s)
		}
	}
}

// reapAt is when the server ends s if it stays idle.
func (s *session) reapAt() (time.Time, bool) {
	switch {
	case s.closed || s.busy:
		return time.Time{}, false
	case s.tx != nil && s.tx.idleTimeout > 0:
		return s.last.Add(s.tx.idleTimeout), true
	case s.tx == nil && s.idleSession > 0:
		return s.last.Add(s.idleSession), true
	}
	return time.Time{}, false
}

// nextReap is the next time reap would end a session (zero: none).
func (db *DB) nextReap() time.Time {
	var next time.Time
	for _, s := range db.sessions {
		if at, ok := s.reapAt(); ok && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// stmt starts a statement of tx (under db.mu): the server's timeouts first, then
// whether tx can still run one.
func (tx *Tx) stmt(ctx context.Context) error {
	tx.db.reap()
	switch {
	case tx.s.closed:
		return ErrSessionEnded
	case tx.done:
		return errTxDone
	case ctx.Err() != nil:
		// A statement cancelled by its client: pgx closes the connection.
		tx.db.terminate(tx.s)
		return ctx.Err()
	}
	tx.s.last = time.Now()
	return nil
}

// wait blocks, with db.mu held on entry and on return, until ready holds: woken by
// every release, and by the server's timeouts. It fails when tx's session ends,
// lock_timeout passes, or ctx ends (the statement is cancelled: the session ends
// with it, as pgx closes a connection whose statement was cancelled).
func (tx *Tx) wait(ctx context.Context, ready func() bool) error {
	db := tx.db
	var lockDeadline time.Time
	if tx.lockTimeout > 0 {
		lockDeadline = time.Now().Add(tx.lockTimeout)
	}
	for waited := false; ; waited = true {
		db.reap()
		if tx.s.closed {
			return ErrSessionEnded
		}
		if ready() {
			tx.s.last = time.Now()
			if waited {
				db.counts["lock-waited"]++
			}
			return nil
		}
		if !lockDeadline.IsZero() && !time.Now().Before(lockDeadline) {
			db.counts["lock-timeout"]++
			return ErrLockTimeout
		}
		wake := db.nextReap()
		if !lockDeadline.IsZero() && (wake.IsZero() || lockDeadline.Before(wake)) {
			wake = lockDeadline
		}
		changed := db.changed
		tx.s.busy = true
		db.mu.Unlock()
		var timer *time.Timer
		var fired <-chan time.Time
		if !wake.IsZero() {
			timer = time.NewTimer(time.Until(wake))
			fired = timer.C
		}
		var err error
		select {
		case <-changed:
		case <-fired:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if timer != nil {
			timer.Stop()
		}
		db.mu.Lock()
		tx.s.busy = false
		tx.s.last = time.Now()
		if err != nil {
			db.terminate(tx.s)
			return err
		}
	}
}

// commit ends tx: its versions become everyone's, its locks go, its notifications
// are delivered.
func (tx *Tx) commit(ctx context.Context) error {
	db := tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if err := tx.stmt(ctx); err != nil {
		return err
	}
	for _, t := range tx.notify {
		t.notifyAll()
	}
	db.endTx(tx, true)
	db.closeSession(tx.s)
	return nil
}

// rollback ends tx, discarding what it wrote. Rolling back an ended transaction does
// nothing, as pgx's Rollback after Commit.
func (tx *Tx) rollback() {
	db := tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if tx.done {
		return
	}
	db.endTx(tx, false)
	db.closeSession(tx.s)
}

// closeSession returns a session whose transaction ended (the model opens one per
// transaction; a pool would keep the connection).
func (db *DB) closeSession(s *session) {
	s.tx = nil
	if !s.closed && s.idleSession == 0 {
		s.closed = true
		db.sessions = slices.DeleteFunc(db.sessions, func(x *session) bool { return x == s })
	}
}

// endTx applies or discards tx's versions and releases its locks (under db.mu).
func (db *DB) endTx(tx *Tx, commit bool) {
	if tx.done {
		return
	}
	tx.done = true
	for _, r := range tx.writes {
		if r.writer != tx {
			continue
		}
		if commit {
			r.committed = r.pending
		}
		r.pending, r.writer = nil, nil
	}
	for _, r := range tx.locked {
		delete(r.locks, tx)
	}
	for key, l := range db.advisory {
		l.holds = slices.DeleteFunc(l.holds, func(h advisoryHold) bool { return h.tx == tx })
		if len(l.holds) == 0 && len(l.waiting) == 0 {
			delete(db.advisory, key)
		}
	}
	if tx.s.tx == tx {
		tx.s.tx = nil
	}
	db.broadcast()
}

// LockMode is a row lock's strength, PostgreSQL's four.
type LockMode int

// The row locks, weakest first. An UPDATE of non-key columns takes ForNoKeyUpdate; a
// DELETE, ForUpdate.
const (
	ForKeyShare LockMode = iota + 1
	ForShare
	ForNoKeyUpdate
	ForUpdate
)

// conflicts is PostgreSQL's table of row lock conflicts.
func (m LockMode) conflicts(o LockMode) bool {
	switch m {
	case ForKeyShare:
		return o == ForUpdate
	case ForShare:
		return o >= ForNoKeyUpdate
	case ForNoKeyUpdate:
		return o >= ForShare
	}
	return true
}

// free reports whether tx may lock r in mode m now.
func (r *row) free(tx *Tx, m LockMode) bool {
	for other, held := range r.locks {
		if other != tx && held.conflicts(m) {
			return false
		}
	}
	return true
}

// lock locks r for tx in mode m, waiting for it unless skip (SKIP LOCKED: false when
// it is held). Under db.mu.
func (tx *Tx) lock(ctx context.Context, r *row, m LockMode, skip bool) (bool, error) {
	if !r.free(tx, m) {
		if skip {
			return false, nil
		}
		if err := tx.wait(ctx, func() bool { return r.free(tx, m) }); err != nil {
			return false, err
		}
	}
	if r.locks == nil {
		r.locks = map[*Tx]LockMode{}
	}
	if held, ok := r.locks[tx]; !ok || held < m {
		if !ok {
			tx.locked = append(tx.locked, r)
		}
		r.locks[tx] = m
	}
	return true, nil
}

// write gives r a new version in tx (nil: deleted), locking it first as an UPDATE or
// DELETE does. It reports false when r no longer exists for tx once the lock is
// had (PostgreSQL re-reads a row it waited for). Under db.mu.
func (tx *Tx) write(ctx context.Context, r *row, v *rec) (bool, error) {
	m := ForNoKeyUpdate
	if v == nil {
		m = ForUpdate
	}
	if _, err := tx.lock(ctx, r, m, false); err != nil {
		return false, err
	}
	if r.view(tx) == nil {
		return false, nil
	}
	tx.set(r, v)
	return true, nil
}

// set gives r version v in tx, which holds its lock or made it.
func (tx *Tx) set(r *row, v *rec) {
	if r.writer != tx {
		r.writer = tx
		tx.writes = append(tx.writes, r)
	}
	r.pending = v
}

// insert adds a row, visible to others once tx commits.
func (tx *Tx) insert(v *rec) *row {
	r := &row{locks: map[*Tx]LockMode{tx: ForUpdate}}
	tx.locked = append(tx.locked, r)
	tx.set(r, v)
	return r
}

// advisoryLock is one advisory lock key's holders and queue.
type advisoryLock struct {
	holds   []advisoryHold
	waiting []*advisoryWait
}

type advisoryHold struct {
	s         *session
	tx        *Tx // nil: held by the session
	exclusive bool
}

type advisoryWait struct {
	s         *session
	exclusive bool
}

// grantable says whether session s may take key (exclusive or shared) now: no other
// session holds it in a conflicting mode, and no conflicting request waits ahead
// (PostgreSQL queues a request behind a waiting one it conflicts with, so a stream of
// shared requests cannot starve an exclusive one).
func (db *DB) grantable(key int64, s *session, exclusive bool, queued *advisoryWait) bool {
	l := db.advisory[key]
	if l == nil {
		return true
	}
	for _, h := range l.holds {
		if h.s != s && (exclusive || h.exclusive) {
			return false
		}
	}
	for _, w := range l.waiting {
		if w == queued {
			break
		}
		if w.s != s && (exclusive || w.exclusive) {
			return false
		}
	}
	return true
}

func (db *DB) grant(key int64, h advisoryHold) {
	l := db.advisory[key]
	if l == nil {
		l = &advisoryLock{}
		db.advisory[key] = l
	}
	l.holds = append(l.holds, h)
}

// tryAdvisory is pg_try_advisory_lock(_shared) on session s (under db.mu).
func (db *DB) tryAdvisory(key int64, s *session, exclusive bool) bool {
	if !db.grantable(key, s, exclusive, nil) {
		return false
	}
	db.grant(key, advisoryHold{s: s, exclusive: exclusive})
	return true
}

// advisoryXact is pg_advisory_xact_lock(_shared) in tx, waiting in the queue (under
// db.mu).
func (tx *Tx) advisoryXact(ctx context.Context, key int64, exclusive bool) error {
	db := tx.db
	if !db.grantable(key, tx.s, exclusive, nil) {
		w := &advisoryWait{s: tx.s, exclusive: exclusive}
		l := db.advisory[key]
		if l == nil {
			l = &advisoryLock{}
			db.advisory[key] = l
		}
		l.waiting = append(l.waiting, w)
		err := tx.wait(ctx, func() bool { return db.grantable(key, tx.s, exclusive, w) })
		if l := db.advisory[key]; l != nil {
			l.waiting = slices.DeleteFunc(l.waiting, func(x *advisoryWait) bool { return x == w })
			if len(l.holds) == 0 && len(l.waiting) == 0 {
				delete(db.advisory, key)
			}
		}
		db.broadcast() // requests queued behind this one look again
		if err != nil {
			return err
		}
	}
	db.grant(key, advisoryHold{s: tx.s, tx: tx, exclusive: exclusive})
	return nil
}

// unlockAdvisory is pg_advisory_unlock(_shared) on session s.
func (db *DB) unlockAdvisory(key int64, s *session) {
	l := db.advisory[key]
	if l == nil {
		return
	}
	if i := slices.IndexFunc(l.holds, func(h advisoryHold) bool { return h.s == s && h.tx == nil }); i >= 0 {
		l.holds = slices.Delete(l.holds, i, i+1)
	}
	if len(l.holds) == 0 && len(l.waiting) == 0 {
		delete(db.advisory, key)
	}
	db.broadcast()
}

// holders are the sessions holding key, oldest session first.
func (db *DB) holders(key int64) []advisoryHold {
	l := db.advisory[key]
	if l == nil {
		return nil
	}
	out := slices.Clone(l.holds)
	slices.SortFunc(out, func(a, b advisoryHold) int { return a.s.id - b.s.id })
	return out
}

func (s *session) String() string { return fmt.Sprintf("session %d", s.id) }
