package pgcdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outbox/outboxdriver"
)

// session is one table's leadership term: its relay's lock, the table's queue on a
// stream term, and the marker of its published rows.
type session struct {
	src           *Source
	lead          outboxdriver.Leadership // the table's single-active-relay lock
	q             *queue
	t             *term         // the stream the queue is fed by
	ownsTerm      bool          // a stream of this table alone: it ends with the session
	marks         *marker       // nil: the table store cannot complete rows outside a claim
	stopMarks     func()        // ends the marker
	marked        chan struct{} // closed when the marker stopped (nil: no marker)
	backfilling   atomic.Bool   // still publishing the rows written before the slot
	backfillUntil int64         // the backfill's last seq
	resentUntil   uint64        // the WAL's end when the session began: what an earlier one may have sent (unpublished)

	resentMu       sync.Mutex
	markedSeq      int64 // the highest marked row's seq at the first claim (markedMax)
	markedSeqKnown bool

	heldMu sync.Mutex
	held   map[string]bool
}

// term is one replication stream's life: its connection, its ledger, and how it
// ended. The tables of a Shared stream share one term.
type term struct {
	st     *stream
	l      *ledger
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	err    atomic.Pointer[error]

	registered map[string]bool // Shared: tables asked about (by its reader only)

	// Shared, by its reader only: the table holding the most events while reading
	// waits, how far it was done when first seen so, and when.
	hog      *queue
	hogDone  uint64
	hogSince time.Time
	rewind   atomic.Bool // ended to be read again from the slot's position (a parked table caught up)
}

// run streams until ctx ends or the connection fails, then wakes the reader's
// waiters and closes the connection.
func (t *term) run() {
	defer close(t.done)
	if err := t.st.run(t.ctx); err != nil {
		t.err.Store(&err)
	}
	t.l.close()
	t.st.close()
}

// alive reports why the stream is unusable (nil: streaming).
func (t *term) alive() error {
	if errp := t.err.Load(); errp != nil {
		return fmt.Errorf("%w: %w", outboxdriver.ErrLeadershipLost, *errp)
	}
	select {
	case <-t.done:
		return fmt.Errorf("%w: replication stream ended", outboxdriver.ErrLeadershipLost)
	default:
	}
	return nil
}

// AcquireLeadership implements outboxdriver.Source: the table's relay lock (so a poll
// relay and a CDC relay never run at once), then the slot. A standby retries. With
// params.Timeout, the replication connection also runs with that
// wal_sender_timeout: PostgreSQL ends the stream of a relay that stopped sending
// status updates (paused, cut off), so the slot is free for the standby as soon as
// the table lock is.
func (s *Source) AcquireLeadership(ctx context.Context, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	if s.shared != nil {
		return s.shared.acquire(ctx, s, params)
	}
	lead, err := s.inner.AcquireLeadership(ctx, params)
	if err != nil || lead == nil {
		return nil, err
	}
	var timeout time.Duration
	if params != nil {
		timeout = params.Timeout
	}
	sess, err := s.start(ctx, lead, timeout)
	if err != nil || sess == nil {
		_ = lead.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	s.mu.Lock()
	s.sess = sess
	s.mu.Unlock()
	return sess, nil
}

// start prepares the publication and the slot and starts streaming. It returns nil
// when another session streams from the slot.
func (s *Source) start(ctx context.Context, lead outboxdriver.Leadership, timeout time.Duration) (*session, error) {
	if err := s.checkServer(ctx); err != nil {
		return nil, err
	}
	if err := s.ensurePublication(ctx); err != nil {
		return nil, err
	}
	si, err := s.slotInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: slot: %w", err)
	}
	if si.active {
		return nil, nil // a session of a relay that just died, until PostgreSQL notices
	}
	streamed, err := s.streamedBefore(ctx)
	if err != nil {
		return nil, err
	}
	if si.lost(streamed) && !s.cfg.RecreateSlot {
		return nil, si.lostError(s.cfg.Slot)
	}
	conn, err := s.connect(ctx, timeout)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	if si, err = prepareSlot(ctx, conn, si, streamed, s.cfg.Slot, s.log, s); err != nil {
		return nil, err
	}
	// A table alone spills nothing: its own transactions hold back only itself.
	l := newLedger(s.cfg.MaxPending, s.cfg.MaxPendingBytes, 0)
	l.reached = uint64(si.confirmed)
	q := newTableQueue(l)
	t := newTerm(ctx, &stream{conn: conn, dec: NewDecoder(s.table, s.table.MessagePrefix), l: l,
		route: func(*Change) (*queue, error) { return q, nil }, statusEvery: s.cfg.StatusInterval, silence: timeout,
		log: s.log, bad: skipBad(&s.skipped, s.log)})
	sess, err := s.newSession(ctx, lead, t, q)
	if err != nil {
		return nil, err
	}
	sess.ownsTerm = true
	if err := startReplication(ctx, conn, s.cfg.Slot, s.cfg.Publication); err != nil {
		sess.stop()
		if errors.Is(err, errSlotInUse) {
			return nil, nil
		}
		return nil, err
	}
	ok = true
	go t.run()
	s.log.Info("pgcdc: streaming", "slot", s.cfg.Slot, "from", si.confirmed, "backfill_until_seq", sess.backfillUntil)
	return sess, nil
}

// prepareSlot replaces a lost slot and creates a missing one (with conn, a
// replication connection), registering it with tables, and returns where it
// stands.
func prepareSlot(ctx context.Context, conn *pgconn.PgConn, si slotInfo, streamed bool, slot string, log *slog.Logger, tables ...*Source) (slotInfo, error) {
	if si.lost(streamed) {
		log.Warn("pgcdc: recreating the lost replication slot; every unpublished row of its tables will be published again", "slot", slot)
		if si.exists {
			if err := pglogrepl.DropReplicationSlot(ctx, conn, slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
				return si, fmt.Errorf("pgcdc: drop lost slot: %w", err)
			}
		}
		si = slotInfo{}
	}
	if !si.exists {
		lsn, err := createSlot(ctx, conn, slot, log, tables...)
		if err != nil {
			return si, err
		}
		si = slotInfo{exists: true, confirmed: lsn}
	}
	return si, nil
}

// newTerm prepares the term of stream st (the caller starts it with go run). It
// lives until cancel, however ctx ends.
func newTerm(ctx context.Context, st *stream) *term {
	t := &term{st: st, l: st.l, done: make(chan struct{}), registered: map[string]bool{}}
	t.ctx, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return t
}

// skipBad counts and logs the WAL messages that are not outbox events.
func skipBad(n *atomic.Int64, log *slog.Logger) func(lsn uint64, err error) {
	return func(lsn uint64, err error) {
		n.Add(1)
		log.Error("pgcdc: skipping a WAL message that is not an outbox event", "lsn", pglogrepl.LSN(lsn), "err", err)
	}
}

var errSlotInUse = errors.New("pgcdc: another session streams from the slot")

// startReplication starts streaming the slot with the publication; errSlotInUse
// when another session streams from it.
func startReplication(ctx context.Context, conn *pgconn.PgConn, slot, publication string) error {
	err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: pluginArgs(publication)})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use
		return errSlotInUse
	}
	if err != nil {
		return fmt.Errorf("pgcdc: start replication: %w", err)
	}
	return nil
}

// newSession starts the table's leadership term on stream term t, fed into q: it
// learns where the table's backfill stands and which aggregates dead letters hold,
// and starts the marker.
func (s *Source) newSession(ctx context.Context, lead outboxdriver.Leadership, t *term, q *queue) (*session, error) {
	sess := &session{src: s, lead: lead, q: q, t: t}
	// Read once the table is ours: whoever published its events before has stopped.
	if err := s.pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&sess.resentUntil); err != nil {
		return nil, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	var backfilled *time.Time
	var until *int64
	err := s.pool.QueryRow(ctx, `SELECT backfilled_at, backfill_until FROM `+s.qCDC+` WHERE slot = $1`, s.cfg.Slot).Scan(&backfilled, &until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Not registered (a slot made by hand, or a table that joined a shared
		// slot): publish the rows before it too (duplicates, never a gap).
		if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qCDC+` (slot) VALUES ($1) ON CONFLICT DO NOTHING`, s.cfg.Slot); err != nil {
			return nil, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	case err != nil:
		return nil, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if backfilled == nil {
		// A relay that died between creating the slot and recording its backfill
		// bound, or a table new to the stream: take today's maximum, read after the
		// stream began to carry the table (duplicates, never a gap).
		if until == nil {
			var n int64
			if err := s.pool.QueryRow(ctx, `WITH m AS (SELECT coalesce(max(seq), 0) AS n FROM `+s.qTable+`)
UPDATE `+s.qCDC+` SET backfill_until = coalesce(backfill_until, m.n) FROM m WHERE slot = $1 RETURNING backfill_until`, s.cfg.Slot).Scan(&n); err != nil {
				return nil, fmt.Errorf("pgcdc: %w", interpret(err))
			}
			until = &n
		}
		sess.backfillUntil = *until
		sess.backfilling.Store(*until > 0)
		if *until == 0 {
			if err := sess.finishBackfill(ctx); err != nil {
				return nil, err
			}
		}
	}
	if err := sess.loadHeld(ctx); err != nil {
		return nil, err
	}
	if s.completer != nil {
		mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		sess.marks, sess.stopMarks = newMarker(sess), cancel
		sess.marked = make(chan struct{})
		go func() {
			defer close(sess.marked)
			sess.marks.run(mctx)
		}()
	}
	return sess, nil
}

// stop ends the marker without draining it.
func (ss *session) stop() {
	if ss.stopMarks != nil {
		ss.stopMarks()
		<-ss.marked
	}
}

// Check implements outboxdriver.Leadership.
func (ss *session) Check(ctx context.Context) error {
	if err := ss.lead.Check(ctx); err != nil {
		return err
	}
	return ss.t.alive()
}

// Release implements outboxdriver.Leadership: the rows already acknowledged are
// marked and their position reported; a stream of this table alone closes; then the
// table lock goes.
func (ss *session) Release(ctx context.Context) error {
	if ss.marks != nil {
		// Rows already acknowledged are marked, and their position confirmed, before
		// the stream closes: a graceful stop sends nothing twice.
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ss.marks.drain(dctx)
		cancel()
	}
	if ss.ownsTerm {
		ss.t.cancel()
		select {
		case <-ss.t.done:
		case <-ctx.Done():
		}
	}
	if ss.stopMarks != nil {
		ss.stopMarks()
		select {
		case <-ss.marked:
		case <-ctx.Done():
		}
	}
	ss.src.mu.Lock()
	if ss.src.sess == ss {
		ss.src.sess = nil
	}
	ss.src.mu.Unlock()
	return ss.lead.Release(ctx)
}

func (s *Source) current() *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sess
}
