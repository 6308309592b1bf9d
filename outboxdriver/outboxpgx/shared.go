package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/pgsql"
)

// Shared is what the relays of many tables in one process share on one database:
// one session holding every table's leadership lock, and one listening for every
// table's wake-ups, so that the sessions a process holds do not grow with its tables.
// Both are taken from the pool given to NewShared; hand the Shared to each table's
// driver with WithShared, and Close it after the relays stopped.
type Shared struct {
	pool *pgxpool.Pool

	// The lock session: its statements run one at a time. gen counts the sessions
	// made: a handle from an earlier one fails, its locks having died with it.
	mu       sync.Mutex
	lock     *pgxpool.Conn
	gen      int
	handles  int
	lastOK   time.Time
	reserved map[int64]int            // lock key -> handles holding it shared, or -1: one exclusively
	holders  map[*sharedConn]struct{} // handles holding a key exclusively with a timeout

	// The wake-up session LISTENs to every subscribed channel; a new channel makes
	// it start again with the whole set (notifications are hints: polling covers
	// the moment between).
	wmu       sync.Mutex
	subs      map[string]map[*subscription]struct{}
	listening map[string]bool // the channels the wake-up session LISTENs to now
	restart   chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
}

// errSharedLost is what a leadership handle says once the shared session it was
// taken on is gone.
var errSharedLost = errors.New("outboxpgx: the shared leadership session was lost")

// NewShared starts the shared sessions on pool (taken from it when first needed).
func NewShared(pool *pgxpool.Pool) *Shared {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Shared{pool: pool, reserved: map[int64]int{}, holders: map[*sharedConn]struct{}{}, subs: map[string]map[*subscription]struct{}{},
		restart: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go s.wakeups(ctx)
	return s
}

// Close ends both sessions (and with the lock session, every lock still held on it).
func (s *Shared) Close() {
	s.cancel()
	<-s.done
	s.mu.Lock()
	s.dropLock()
	s.mu.Unlock()
}

// WithShared returns a driver whose relay takes its leadership lock on sh's lock
// session and its wake-ups from sh's listening session.
func (d *Driver) WithShared(sh *Shared) *Driver {
	out := *d
	out.shared = sh
	return &out
}

// dropLock ends the lock session. Called with mu held.
func (s *Shared) dropLock() {
	if s.lock != nil {
		_ = s.lock.Hijack().Close(context.Background())
		s.lock = nil
	}
}

// sharedDB is the pgsql.DB of a shared driver's sessions: statements go to the pool,
// Conn hands out the lock session.
type sharedDB struct {
	db
	s *Shared
}

func (d sharedDB) Conn(ctx context.Context) (pgsql.Conn, error) {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revokeSilent()
	if s.lock == nil {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		s.lock, s.gen = c, s.gen+1
	}
	s.handles++
	return &sharedConn{s: s, gen: s.gen}, nil
}

// sharedConn is one leadership's handle on the lock session.
type sharedConn struct {
	s      *Shared
	gen    int
	closed bool
	// key is the lock this handle reserved, if any; revoked once it went silent
	// for longer than timeout (its last call at used).
	key                 int64
	reserved, exclusive bool
	timeout             time.Duration
	used                time.Time
	revoked             bool
}

// Reserve implements pgsql.SharedConn.
func (c *sharedConn) Reserve(key int64, exclusive bool, timeout time.Duration) bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.revokeSilent()
	n := c.s.reserved[key]
	if c.reserved || n < 0 || exclusive && n > 0 {
		return false
	}
	if exclusive {
		c.s.reserved[key] = -1
	} else {
		c.s.reserved[key] = n + 1
	}
	c.key, c.reserved, c.exclusive, c.timeout, c.used = key, true, exclusive, timeout, time.Now()
	if exclusive && timeout > 0 {
		c.s.holders[c] = struct{}{}
	}
	return true
}

// unreserve gives the handle's key back. Called with mu held.
func (c *sharedConn) unreserve() {
	if !c.reserved {
		return
	}
	c.reserved = false
	delete(c.s.holders, c)
	if n := c.s.reserved[c.key]; c.exclusive || n <= 1 {
		delete(c.s.reserved, c.key)
	} else {
		c.s.reserved[c.key] = n - 1
	}
}

// revokeSilent ends the leadership of every handle silent for longer than its
// timeout: the lock is released on the session, the key given back, and the
// handle's next call fails. The database does that to a silent session of its own;
// a shared one stays alive while any of its leaderships calls, so it is done here,
// whenever the session is used. Called with mu held.
func (s *Shared) revokeSilent() {
	for h := range s.holders {
		if time.Since(h.used) <= h.timeout {
			continue
		}
		if s.lock != nil && s.gen == h.gen {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := s.lock.Exec(ctx, "SELECT pg_advisory_unlock($1)", h.key)
			cancel()
			if err != nil && s.lock.Conn().IsClosed() {
				s.dropLock()
			}
		}
		h.revoked = true
		h.unreserve()
	}
}

// session returns the lock session if it is still the one this handle was taken
// on. Called with mu held.
func (c *sharedConn) session() (*pgxpool.Conn, error) {
	c.s.revokeSilent()
	if c.closed || c.revoked || c.s.lock == nil || c.s.gen != c.gen {
		return nil, errSharedLost
	}
	c.used = time.Now()
	return c.s.lock, nil
}

// done notes the outcome of a statement: a failure that closed the session drops
// it, so that the next leadership makes a new one. Called with mu held.
func (c *sharedConn) done(err error) {
	if err == nil {
		c.s.lastOK = time.Now()
		return
	}
	if c.s.lock != nil && c.s.lock.Conn().IsClosed() {
		c.s.dropLock()
	}
}

func (c *sharedConn) Exec(ctx context.Context, sql string, args ...any) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	conn, err := c.session()
	if err != nil {
		return err
	}
	// A leadership check proves the session is alive: one that did so a moment ago
	// answers for every table's check (hundreds per second otherwise).
	if sql == "SELECT 1" && len(args) == 0 && time.Since(c.s.lastOK) < 200*time.Millisecond {
		return nil
	}
	_, err = conn.Exec(ctx, sql, args...)
	c.done(err)
	return err
}

func (c *sharedConn) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	c.s.mu.Lock()
	conn, err := c.session()
	if err != nil {
		c.s.mu.Unlock()
		return nil, err
	}
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		c.done(err)
		c.s.mu.Unlock()
		return nil, err
	}
	// The session is the caller's until it closes the rows.
	return &sharedRows{Rows: rows, c: c}, nil
}

// Close gives the handle back; the last one ends the session (nothing is locked on
// it any more: a leadership unlocks before it closes).
func (c *sharedConn) Close() error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.unreserve()
	c.s.handles--
	if c.s.handles == 0 {
		c.s.dropLock()
	}
	return nil
}

type sharedRows struct {
	pgx.Rows
	c      *sharedConn
	closed bool
}

func (r *sharedRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.c.done(r.Err())
	r.c.s.mu.Unlock()
}

// subscription is one table's listener on the wake-up session; ready closes once
// the session LISTENs to its channel.
type subscription struct {
	s       *Shared
	channel string
	ch      chan struct{}
	ready   chan struct{}
	isReady bool
}

// markReady closes ready. Called with wmu held.
func (l *subscription) markReady() {
	if !l.isReady {
		l.isReady = true
		close(l.ready)
	}
}

// listenFunc is a shared driver's Store.ListenFunc for channel.
func (s *Shared) listenFunc(channel string) func(ctx context.Context) (outboxdriver.Listener, error) {
	// Like a listener of its own, it returns once the channel is listened to: a
	// write committed after Listen returned wakes it.
	return func(ctx context.Context) (outboxdriver.Listener, error) {
		sub := &subscription{s: s, channel: channel, ch: make(chan struct{}, 1), ready: make(chan struct{})}
		s.wmu.Lock()
		set := s.subs[channel]
		if set == nil {
			set = map[*subscription]struct{}{}
			s.subs[channel] = set
		}
		set[sub] = struct{}{}
		// A channel the session listens to already needs nothing more (a relay
		// listens again every LeaderTimeout: restarting the session for it would
		// lose every table's notifications meanwhile).
		listening := s.listening[channel]
		if listening {
			sub.markReady()
		}
		s.wmu.Unlock()
		if !listening {
			select {
			case s.restart <- struct{}{}:
			default:
			}
		}
		select {
		case <-sub.ready:
			return sub, nil
		case <-ctx.Done():
			_ = sub.Close(ctx)
			return nil, fmt.Errorf("outboxpgx: waiting for the shared listener: %w", ctx.Err())
		case <-s.done:
			return nil, errors.New("outboxpgx: the shared listener is closed")
		}
	}
}

func (l *subscription) Wait(ctx context.Context) error {
	select {
	case <-l.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.s.done:
		return errors.New("outboxpgx: the shared listener is closed")
	}
}

func (l *subscription) Close(context.Context) error {
	l.s.wmu.Lock()
	defer l.s.wmu.Unlock()
	if set := l.s.subs[l.channel]; set != nil {
		delete(set, l)
		if len(set) == 0 {
			delete(l.s.subs, l.channel)
		}
	}
	return nil
}

// Wake wakes the relays of table on these sessions as a notification would: for a
// caller that found the table has work by other means (PendingTables), a write
// whose notification was coalesced away, say.
func (s *Shared) Wake(table outboxdriver.Table) {
	channel := pgsql.ChannelOf(table)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for sub := range s.subs[channel] {
		select {
		case sub.ch <- struct{}{}:
		default:
		}
	}
}

// sharedListenIdle is how long the wake-up session may stay silent before it is
// checked (a half-open connection would otherwise wait for ever).
const sharedListenIdle = 30 * time.Second

// wakeups runs the wake-up session until ctx ends: LISTEN on every subscribed
// channel, and hand each notification to its channel's subscriptions.
func (s *Shared) wakeups(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		s.wmu.Lock()
		channels := make([]string, 0, len(s.subs))
		for ch := range s.subs {
			channels = append(channels, ch)
		}
		s.wmu.Unlock()
		if len(channels) == 0 {
			select {
			case <-ctx.Done():
			case <-s.restart:
			}
			continue
		}
		err := s.listenOnce(ctx, channels)
		if ctx.Err() == nil && err != nil {
			select { // a session that failed is made again after a pause
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// listenOnce listens on channels until the session fails, the set of channels
// changes (nil) or ctx ends.
func (s *Shared) listenOnce(ctx context.Context, channels []string) error {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// It will LISTEN: closed, never back to the pool, but held as the pool's own
	// until then, so that it counts against the pool's size.
	conn := c.Conn()
	defer func() {
		_ = conn.Close(context.Background())
		c.Release()
	}()
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return err
		}
	}
	listening := map[string]bool{}
	for _, ch := range channels {
		listening[ch] = true
	}
	s.wmu.Lock()
	s.listening = listening
	for ch := range listening {
		for sub := range s.subs[ch] {
			sub.markReady()
		}
	}
	s.wmu.Unlock()
	defer func() {
		s.wmu.Lock()
		s.listening = nil
		s.wmu.Unlock()
	}()
	for {
		wctx, cancel := context.WithTimeout(ctx, sharedListenIdle)
		go func() {
			select {
			case <-s.restart:
				cancel()
			case <-wctx.Done():
			}
		}()
		n, err := conn.WaitForNotification(wctx)
		werr := wctx.Err()
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(werr, context.DeadlineExceeded):
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil {
				return fmt.Errorf("outboxpgx: shared listener: %w", err)
			}
		case werr != nil:
			// A new channel: listen again, on the whole set.
		case err != nil:
			return fmt.Errorf("outboxpgx: shared listener: %w", err)
		default:
			s.wmu.Lock()
			for sub := range s.subs[n.Channel] {
				select {
				case sub.ch <- struct{}{}:
				default:
				}
			}
			s.wmu.Unlock()
		}
		// The set is read again whatever woke us: a restart signal taken by the
		// goroutine of a wait that had already ended must not leave a channel
		// unheard.
		s.wmu.Lock()
		stale := false
		for ch := range s.subs {
			stale = stale || !listening[ch]
		}
		s.wmu.Unlock()
		if stale {
			return nil
		}
	}
}
