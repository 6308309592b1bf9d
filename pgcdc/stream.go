package pgcdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxd/outbox/internal/failpoint"
)

// stream is the thin I/O loop over one replication connection: it reads pgoutput,
// hands it to the decoder, queues the events, and reports the confirmable position
// back to PostgreSQL. It alone touches the connection.
type stream struct {
	conn        *pgconn.PgConn
	dec         *Decoder
	l           *ledger
	route       func(*Change) (*queue, error) // the queue of an event's table (nil: not relayed here)
	statusEvery time.Duration
	// silence is how long the server may send nothing, though asked to answer, before
	// the connection is taken for dead (0: silenceDefault). A healthy walsender that
	// has sent everything is silent; a status update that requests a reply makes it
	// send a keepalive at once, so a black-holed connection is found within this
	// bound even while the lock session (and so the leadership) still answers.
	silence time.Duration
	log     *slog.Logger
	bad     func(lsn uint64, err error) // an undecodable event, skipped
	behind  func(first bool)            // reading waits for acknowledgements, called as it starts (first) and on (nil: log it)

	touched []*queue // the queues the transaction being read pushed into
	// unqueued is an event read that could be neither held whole nor spilled: reading
	// waits until there is room for it (its queue is unqueuedTo).
	unqueued   *Change
	unqueuedTo *queue

	wmu      sync.Mutex // status updates come from the reader and from acknowledgements
	lastSent uint64
	closed   bool
}

// close ends the connection once no status update is being written.
func (s *stream) close() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.closed = true
	_ = s.conn.Close(context.Background())
}

// pluginArgs are pgoutput's options: protocol 1 (whole transactions, sent only once
// committed, never streamed in progress: nothing of a transaction that may roll back
// reaches the relay), binary values, and logical messages for the table-less mode.
func pluginArgs(publication string) []string {
	return []string{"proto_version '1'", "publication_names '" + publication + "'", "binary 'true'", "messages 'true'"}
}

// silenceDefault bounds a silent server when no timeout is configured: PostgreSQL's
// own default wal_sender_timeout.
const silenceDefault = time.Minute

// ErrServerSilent ends a stream whose server sent nothing for the silence bound,
// though asked to answer: a connection cut without a reset (a black hole).
var ErrServerSilent = errors.New("pgcdc: the replication server went silent")

// run reads until ctx ends (then reports the final position and returns nil) or the
// connection fails or falls silent.
func (s *stream) run(ctx context.Context) error {
	nextStatus := time.Now()
	nc := s.conn.Conn()
	var deadline time.Time
	waiting := false
	silence := cmp.Or(s.silence, silenceDefault)
	heard := time.Now() // the last message read, or the last time reading resumed
	// Shutdown interrupts a read in progress.
	defer context.AfterFunc(ctx, func() { _ = nc.SetReadDeadline(time.Now()) })()
	for {
		if ctx.Err() != nil {
			_ = s.sendStatus(true)
			return nil
		}
		if now := time.Now(); !now.Before(nextStatus) {
			quiet := now.Sub(heard)
			if quiet > silence {
				return fmt.Errorf("%w: nothing for %v, though asked to answer; the connection is taken for dead", ErrServerSilent, quiet.Round(time.Millisecond))
			}
			// Quiet for a status period: ask for an answer, which a live server gives.
			if err := s.status(true, quiet >= min(s.statusEvery, silence/4)); err != nil {
				return err
			}
			nextStatus = now.Add(min(s.statusEvery, silence/4))
		}
		if !s.ready(nextStatus) {
			heard = time.Now() // reading nothing, so hearing nothing is no sign
			first := !waiting
			waiting = true
			switch {
			case s.behind != nil:
				s.behind(first)
			case first:
				s.log.Info("pgcdc: reading waits: as many events as --max-pending (or --max-pending-bytes) wait for the broker")
			}
			continue // the relay is behind: keep the server informed, read nothing
		}
		waiting = false
		// A read deadline on the socket rather than a context per message: a context
		// costs a timer and a watcher each time, a quarter of the reader's CPU.
		if !deadline.Equal(nextStatus) {
			deadline = nextStatus
			_ = nc.SetReadDeadline(deadline)
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			var netErr net.Error
			if (errors.As(err, &netErr) && netErr.Timeout()) || ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("pgcdc: replication stream: %w", err)
		}
		heard = time.Now()
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("pgcdc: %w", err)
				}
				// Between transactions everything up to the server's position has
				// been sent: an idle (or filtered-out) stretch of WAL is confirmable
				// once what came before it is published, so the slot never pins WAL.
				if !s.dec.InTransaction() {
					s.l.mark(uint64(k.ServerWALEnd))
				}
				if k.ReplyRequested {
					nextStatus = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("pgcdc: %w", err)
				}
				// The connection reuses its buffer; events keep slices of this copy.
				if err := s.handle(slices.Clone(x.WALData), uint64(x.WALStart)); err != nil {
					return err
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("pgcdc: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return fmt.Errorf("pgcdc: the server ended the replication stream")
		}
	}
}

func (s *stream) handle(data []byte, at uint64) error {
	ch, err := s.dec.Decode(data)
	if err != nil {
		return fmt.Errorf("at %s: %w", pglogrepl.LSN(at), err)
	}
	switch ch.Kind {
	case ChangeEvent:
		if ch.Bad != nil {
			s.bad(at, ch.Bad)
			return nil
		}
		q, err := s.route(&ch)
		if err != nil {
			return fmt.Errorf("at %s: %w", pglogrepl.LSN(at), err)
		}
		if q == nil {
			return nil
		}
		if !q.push(&ch) {
			s.unqueued, s.unqueuedTo = &ch, q // queued once there is room
			return nil
		}
		s.pushed(q, &ch)
	case ChangeCommit:
		for _, q := range s.touched {
			q.committed(ch.CommitLSN)
		}
		clear(s.touched)
		s.touched = s.touched[:0]
		s.l.mark(ch.EndLSN)
	}
	return nil
}

// pushed notes that q took ch's event.
func (s *stream) pushed(q *queue, ch *Change) {
	if ch.CommitLSN != 0 && !slices.Contains(s.touched, q) {
		s.touched = append(s.touched, q)
	}
	failpoint.Hit(failpoint.WALAfterReceive)
}

// ready waits until the next message may be read, or deadline passes: the event
// read last and not queued (no room, and it could not be spilled) is queued first,
// whole, once there is room; then another event must fit, whole or spilled. It
// reports whether reading may go on.
func (s *stream) ready(deadline time.Time) bool {
	if s.unqueued != nil && !s.unqueuedTo.takes() {
		// Parked (or let go) while it waited: a parked table's events after it are
		// read again once it caught up, and a table let go has none.
		s.unqueued, s.unqueuedTo = nil, nil
	}
	if s.unqueued != nil {
		if !s.l.waitSpace(deadline) {
			return false
		}
		if !s.unqueuedTo.push(s.unqueued) {
			return false // room went between the two (not while one reader pushes)
		}
		s.pushed(s.unqueuedTo, s.unqueued)
		s.unqueued, s.unqueuedTo = nil, nil
	}
	return s.l.waitRead(deadline)
}

// sendStatus reports the confirmable position: write, flush and apply are all set to
// it explicitly (pglogrepl would otherwise copy the write position into flush).
// Unless always, it sends only when the position moved: the relay calls it after each
// acknowledged batch, so a crash repeats at most the batch in flight (or, for a
// transaction larger than a batch, what of it was already sent: a transaction is
// confirmed whole).
func (s *stream) sendStatus(always bool) error { return s.status(always, false) }

// status sends a status update; reply asks the server to answer it at once.
func (s *stream) status(always, reply bool) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	lsn := s.l.confirmedLSN()
	if s.closed || lsn == 0 || (!always && lsn == s.lastSent) {
		return nil
	}
	// The write goes straight to the socket; the reader may be inside a receive.
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(lsn), WALFlushPosition: pglogrepl.LSN(lsn), WALApplyPosition: pglogrepl.LSN(lsn),
		ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("pgcdc: standby status update: %w", err)
	}
	if lsn != s.lastSent {
		s.log.Debug("pgcdc: confirmed", "lsn", pglogrepl.LSN(lsn))
		s.lastSent = lsn
	}
	return nil
}
