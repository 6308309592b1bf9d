package pgcdc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outbox/outboxdriver"
)

// session is one leadership term: a replication connection and its queue.
type session struct {
	src           *Source
	lead          outboxdriver.Leadership // the table's single-active-relay lock
	q             *queue
	st            *stream
	marks         *marker // nil: the table store cannot complete rows outside a claim
	cancel        context.CancelFunc
	done          chan struct{}
	marked        chan struct{} // closed when the marker stopped (nil: no marker)
	err           atomic.Pointer[error]
	backfilling   atomic.Bool // still publishing the rows written before the slot
	backfillUntil int64       // the backfill's last seq

	heldMu sync.Mutex
	held   map[string]bool
}

// AcquireLeadership implements outboxdriver.Source: the table's relay lock (so a poll
// relay and a CDC relay never run at once), then the slot. A standby retries. With
// params.Timeout, the replication connection also runs with that
// wal_sender_timeout: PostgreSQL ends the stream of a relay that stopped sending
// status updates (paused, cut off), so the slot is free for the standby as soon as
// the table lock is.
func (s *Source) AcquireLeadership(ctx context.Context, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
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
	var registered bool
	var backfilled *time.Time
	var until *int64
	err = s.pool.QueryRow(ctx, `SELECT backfilled_at, backfill_until FROM `+s.qCDC+` WHERE slot = $1`, s.cfg.Slot).Scan(&backfilled, &until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("pgcdc: %w", interpret(err))
	default:
		registered = true
	}
	lost := (si.exists && si.walStatus == "lost") || (!si.exists && registered && backfilled != nil)
	if lost && !s.cfg.RecreateSlot {
		return nil, fmt.Errorf("%w (%w): slot %q (wal_status %q): events written since its last confirmed position may be gone from the WAL; "+
			"recover with `outbox relay --mode cdc --recreate-slot` (docs/cdc.md)", ErrSlotLost, outboxdriver.ErrNeedsOperator, s.cfg.Slot, map[bool]string{true: si.walStatus, false: "dropped"}[si.exists])
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
	if lost {
		s.log.Warn("pgcdc: recreating the lost replication slot; every unpublished row in the table will be published again", "slot", s.cfg.Slot)
		if si.exists {
			if err := pglogrepl.DropReplicationSlot(ctx, conn, s.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
				return nil, fmt.Errorf("pgcdc: drop lost slot: %w", err)
			}
		}
		si = slotInfo{}
	}
	if !si.exists {
		if si.confirmed, err = s.createSlot(ctx, conn); err != nil {
			return nil, err
		}
		backfilled, until = nil, nil // read again below
	} else if !registered {
		// A slot made by hand: publish the rows before it too (duplicates, never a gap).
		if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.qCDC+` (slot) VALUES ($1) ON CONFLICT DO NOTHING`, s.cfg.Slot); err != nil {
			return nil, fmt.Errorf("pgcdc: %w", interpret(err))
		}
	}
	sess := &session{src: s, lead: lead, q: newQueue(s.cfg.MaxPending, s.cfg.MaxPendingBytes), done: make(chan struct{})}
	sess.q.confirmed = uint64(si.confirmed)
	if backfilled == nil {
		// A relay that died between creating the slot and recording its backfill
		// bound: take today's maximum (duplicates, never a gap).
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
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: pluginArgs(s.cfg.Publication)})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another session streams
			return nil, nil
		}
		return nil, fmt.Errorf("pgcdc: start replication: %w", err)
	}
	ok = true
	st := &stream{conn: conn, dec: NewDecoder(s.table, s.table.MessagePrefix), q: sess.q, statusEvery: s.cfg.StatusInterval,
		log: s.log, failpoint: s.cfg.Failpoint, bad: func(lsn uint64, err error) {
			s.skipped.Add(1)
			s.log.Error("pgcdc: skipping a WAL message that is not an outbox event", "lsn", pglogrepl.LSN(lsn), "err", err)
		}}
	sess.st = st
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sess.cancel = cancel
	if s.completer != nil {
		sess.marks = newMarker(sess)
		sess.marked = make(chan struct{})
		go func() {
			defer close(sess.marked)
			sess.marks.run(runCtx)
		}()
	}
	go func() {
		defer close(sess.done)
		err := st.run(runCtx)
		if err != nil {
			sess.err.Store(&err)
		}
		sess.q.close()
		st.close()
	}()
	s.log.Info("pgcdc: streaming", "slot", s.cfg.Slot, "from", si.confirmed, "backfill_until_seq", sess.backfillUntil)
	return sess, nil
}

// Check implements outboxdriver.Leadership.
func (ss *session) Check(ctx context.Context) error {
	if err := ss.lead.Check(ctx); err != nil {
		return err
	}
	if errp := ss.err.Load(); errp != nil {
		return fmt.Errorf("%w: %w", outboxdriver.ErrLeadershipLost, *errp)
	}
	select {
	case <-ss.done:
		return fmt.Errorf("%w: replication stream ended", outboxdriver.ErrLeadershipLost)
	default:
	}
	return nil
}

// Release implements outboxdriver.Leadership: the stream reports its last confirmed
// position and closes, then the table lock goes.
func (ss *session) Release(ctx context.Context) error {
	if ss.marks != nil {
		// Rows already acknowledged are marked, and their position confirmed, before
		// the stream closes: a graceful stop sends nothing twice.
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ss.marks.drain(dctx)
		cancel()
	}
	ss.cancel()
	select {
	case <-ss.done:
	case <-ctx.Done():
	}
	if ss.marked != nil {
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
