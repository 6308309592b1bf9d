package pgcdc

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
)

// Capabilities implements outboxdriver.Source: the table store's completions (its
// backfill completes rows; streamed events have no row to complete), custom columns,
// wake-ups from the stream, and claims completed in parts as the table store's are
// (a slow key holds only itself); never several active relays.
func (s *Source) Capabilities() outboxdriver.Capabilities {
	inner := s.inner.Capabilities()
	return outboxdriver.Capabilities{Completions: inner.Completions, Columns: true, Listen: true, Split: inner.Split,
		CompletesLater: s.completer != nil}
}

// CompletePublished implements outboxdriver.Completer with the table store's: a
// transactional publisher's resume completes the rows the broker already holds.
func (s *Source) CompletePublished(ctx context.Context, ids []string, c outboxdriver.Completion) error {
	if s.completer == nil {
		return fmt.Errorf("pgcdc: the table store cannot complete rows outside a claim: %w", outboxdriver.ErrNotSupported)
	}
	return s.completer.CompletePublished(ctx, ids, c)
}

// Claim implements outboxdriver.Source. While the rows written before the slot are
// being published it claims them from the table; then it hands out events from the
// WAL in commit order, holding back an aggregate behind its waiting event.
func (s *Source) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	if len(p.Skip) > 0 && !s.inner.Capabilities().Split {
		return nil, fmt.Errorf("claim skipping aggregates: %w", outboxdriver.ErrNotSupported)
	}
	ss := s.current()
	if ss == nil {
		return nil, outboxdriver.ErrLeadershipLost
	}
	if ss.backfilling.Load() {
		backfill := *p // the relay's bounds (bytes, hold timeout), up to the slot's start
		backfill.MaxSeq = ss.backfillUntil
		c, err := s.inner.Claim(ctx, &backfill)
		if err != nil {
			return nil, err
		}
		if len(c.Rows()) > 0 {
			return backfillClaim{c}, nil
		}
		if err := ss.finishBackfill(ctx); err != nil {
			return nil, err
		}
		if ss.backfilling.Load() {
			return c, nil // rows still wait for a retry
		}
	}
	var skip map[string]bool
	if len(p.Skip) > 0 {
		skip = make(map[string]bool, len(p.Skip))
		for _, a := range p.Skip {
			skip[outboxdriver.AggregateKey(a.Type, a.ID)] = true
		}
	}
	for lingered := false; ; {
		out, held := ss.q.take(p.Limit, p.MaxBytes, time.Now(), skip, ss.holds)
		if len(held) == 0 && len(out) > 0 && len(out) < p.Limit && !p.Enough(payloadBytes(out)) && !lingered && s.cfg.ClaimLinger > 0 {
			// A trickle: wait a moment for the rest of the transaction and its
			// neighbours, so a batch is not one event (per-event batches cost a
			// round of wake-ups in the relay, the broker and the walsender each).
			ss.q.giveBack(out)
			lingered = true
			t := time.NewTimer(s.cfg.ClaimLinger)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		if len(held) == 0 {
			whole, err := ss.hydrate(ctx, out)
			if err != nil {
				ss.q.giveBack(out)
				return nil, err
			}
			kept, err := ss.unpublished(ctx, whole)
			if err != nil {
				ss.q.giveBack(whole)
				return nil, err
			}
			if len(kept) == 0 && len(out) > 0 {
				continue // all sent again, and published before: take what follows
			}
			return &claim{ss: ss, es: kept}, nil
		}
		// Give the events back before the database work: the next take starts over.
		ss.q.giveBack(out)
		whole, err := ss.hydrate(ctx, held)
		if err != nil {
			ss.q.giveBack(held)
			return nil, err
		}
		if err := ss.deadLetter(ctx, whole, p.FlowPastDeadLetters); err != nil {
			ss.q.giveBack(whole)
			return nil, err
		}
	}
}

// hydrate reads from the table the payloads (and headers) of es's spilled events
// (held without them, ledger.maxSpilled), once their transactions are visible to
// other sessions. An event whose row is no longer there unpublished (completed
// since, or deleted by hand) is done and left out: the table is what a rows-mode
// event is. Nothing is done when it fails.
func (ss *session) hydrate(ctx context.Context, es []*entry) ([]*entry, error) {
	var ids []string
	var xids []uint32
	headers := false // some had headers: the table has the column
	for _, e := range es {
		if e.spilled && e.row.Payload == nil {
			ids, xids = append(ids, e.row.ID), append(xids, e.xid)
			headers = headers || e.headers
		}
	}
	if len(ids) == 0 {
		return es, nil
	}
	if err := ss.src.waitVisible(ctx, xids); err != nil {
		return nil, err
	}
	// The values as the stream carries them: the payload's and headers' bytes
	// (JSON text for json and jsonb, raw for bytea), read by the same rules.
	headersCol := "NULL::bytea"
	if headers {
		headersCol = "headers"
	}
	rows, err := ss.src.pool.Query(ctx, `SELECT id::text, payload, `+headersCol+` FROM `+ss.src.qTable+`
WHERE id = ANY($1::text[]::uuid[]) AND published_at IS NULL AND payload IS NOT NULL`, ids)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: reading spilled events' payloads: %w", interpret(err))
	}
	type stored struct{ payload, headers []byte }
	read := make(map[string]stored, len(ids))
	var id string
	var payload, hdrs []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &payload, &hdrs}, func() error {
		read[id] = stored{append([]byte{}, payload...), append([]byte(nil), hdrs...)}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("pgcdc: reading spilled events' payloads: %w", interpret(err))
	}
	kept := make([]*entry, 0, len(es))
	var gone []*entry
	for _, e := range es {
		if e.spilled && e.row.Payload == nil {
			r, ok := read[e.row.ID]
			if !ok {
				gone = append(gone, e)
				continue
			}
			e.row.Payload = r.payload
			if e.headers {
				e.row.Headers = outboxdriver.ParseHeaders(r.headers)
			}
		}
		kept = append(kept, e)
	}
	if len(gone) > 0 {
		ss.q.done(gone)
		ss.src.log.Info("pgcdc: skipped spilled events whose rows were no longer unpublished in the table (published before, or deleted)", "events", len(gone))
	}
	return kept, nil
}

// published hands acknowledged events on: rows of the table to the marker, which
// completes them there before they count as done (and tells p.Completed);
// table-less events are done.
func (ss *session) published(es []*entry, p *outboxdriver.CompleteParams) {
	if ss.marks == nil {
		ss.q.done(es)
		return
	}
	var rows []*entry
	done := es[:0:0]
	for _, e := range es {
		if e.inserted {
			rows = append(rows, e)
		} else {
			done = append(done, e)
		}
	}
	ss.q.done(done)
	if p.Completed != nil && len(done) > 0 {
		ids := make([]string, len(done))
		for i, e := range done {
			ids[i] = e.row.ID
		}
		p.Completed(ids)
	}
	ss.marks.add(rows, p.Completion, p.Completed)
}

// unpublished returns es without the events whose rows are marked published: the
// stream sends again what followed the slot's confirmed position, which can trail
// the marks (a relay killed before it reported the position, a PostgreSQL crash
// before the slot was saved), and a transactional publisher's resume marks what the
// broker already holds. Only events committed before this session began are asked
// about (nothing later was streamed before), and of those only rows at or below the
// highest marked one; the others are done.
func (ss *session) unpublished(ctx context.Context, es []*entry) ([]*entry, error) {
	if len(es) == 0 {
		return es, nil
	}
	markedMax, err := ss.markedMax(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	var xids []uint32
	for _, e := range es {
		if e.inserted && e.reject == nil && e.commitLSN != 0 && e.commitLSN <= ss.resentUntil && e.row.Seq <= markedMax {
			ids, xids = append(ids, e.row.ID), append(xids, e.xid)
		}
	}
	if len(ids) == 0 {
		return es, nil
	}
	// Committed before the session began, yet perhaps not visible to others yet.
	if err := ss.src.waitVisible(ctx, xids); err != nil {
		return nil, err
	}
	rows, err := ss.src.pool.Query(ctx, `SELECT id::text FROM `+ss.src.qTable+` WHERE id = ANY($1::text[]::uuid[]) AND published_at IS NOT NULL`, ids)
	if err != nil {
		return nil, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if len(ids) == 0 {
		return es, nil
	}
	marked := make(map[string]bool, len(ids))
	for _, id := range ids {
		marked[id] = true
	}
	kept := make([]*entry, 0, len(es))
	var done []*entry
	for _, e := range es {
		if e.inserted && e.reject == nil && marked[e.row.ID] {
			done = append(done, e)
		} else {
			kept = append(kept, e)
		}
	}
	ss.q.done(done)
	ss.src.log.Info("pgcdc: skipped events the stream sent again whose rows are marked published", "events", len(done))
	return kept, nil
}

// finishBackfill ends the backfill once no row before the slot waits any more.
func (ss *session) finishBackfill(ctx context.Context) error {
	s := ss.src
	var left bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.qTable+` AS o WHERE o.published_at IS NULL AND o.seq <= $1
  AND `+sqlrules.NotHeldSQL(s.qDead)+`)`,
		ss.backfillUntil).Scan(&left)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if left {
		return nil
	}
	// What is left, if anything, an aggregate's dead letter holds back. After the
	// backfill only the stream is read, and a replay brings the dead letter back through
	// the stream alone: in the table these rows would wait for ever. They join the dead
	// letters, waiting behind it, as the stream's own held events do, so replaying the
	// aggregate brings them back through the stream, in order.
	tag, err := s.pool.Exec(ctx, `WITH held AS (DELETE FROM `+s.qTable+` AS o WHERE o.published_at IS NULL AND o.seq <= $1
  AND NOT `+sqlrules.NotHeldSQL(s.qDead)+`
  RETURNING o.id, o.aggregatetype, o.aggregateid, o.type, o.payload, o.headers, o.tracingspancontext, o.seq, o.created_at, o.attempts)
INSERT INTO `+s.qDead+` (`+sqlrules.DeadLetterColumns+`) SELECT *, $2, false FROM held ON CONFLICT (id) DO NOTHING`,
		ss.backfillUntil, outboxdriver.WaitingBehindDeadLetter)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if n := tag.RowsAffected(); n > 0 {
		s.log.Warn("pgcdc: rows written before the slot, held back by dead letters of their aggregates, moved to the dead letters behind them; replaying an aggregate publishes them", "rows", n)
	}
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.qCDC+` SET backfilled_at = now() WHERE slot = $1`, s.cfg.Slot); err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	if ss.backfilling.Swap(false) {
		s.log.Info("pgcdc: rows written before the slot are published; streaming from the WAL", "slot", s.cfg.Slot)
	}
	return nil
}

func (ss *session) loadHeld(ctx context.Context) error {
	rows, err := ss.src.pool.Query(ctx, `SELECT DISTINCT aggregatetype, aggregateid FROM `+ss.src.qDead+` WHERE holds_key`)
	if err != nil {
		return fmt.Errorf("pgcdc: %w", interpret(err))
	}
	ss.held = map[string]bool{}
	for rows.Next() {
		var r outboxdriver.Row
		if err := rows.Scan(&r.AggregateType, &r.AggregateID); err != nil {
			rows.Close()
			return err
		}
		ss.held[aggregateKey(&r)] = true
	}
	return rows.Err()
}

// holds reports whether a dead letter holds the aggregate (as far as this relay
// knows; deadLetter asks the database again before it acts on it).
func (ss *session) holds(key string) bool {
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	return ss.held[key]
}

func payloadBytes(es []*entry) int {
	n := 0
	for _, e := range es {
		n += e.size
	}
	return n
}

// claim is a batch of events handed to the relay.
type claim struct {
	ss   *session
	es   []*entry
	rows []outboxdriver.Row
	once bool
	// left are the events Complete did not name (a slow key's, still in flight at
	// the broker; or held back by the relay behind one): given back to the queue,
	// where claims skip their aggregates until Settle writes their outcome.
	left map[*entry]bool
}

func (c *claim) Rows() []outboxdriver.Row {
	if c.rows == nil && len(c.es) > 0 {
		c.rows = make([]outboxdriver.Row, len(c.es))
		for i, e := range c.es {
			c.rows[i] = e.row
		}
	}
	return c.rows
}

// Complete implements outboxdriver.Claim: acknowledged events are done (their
// position becomes confirmable), dead ones go to the dead letters first, and failed
// ones wait in the queue, in order, for their retry time. Events p does not name go
// back to the queue unchanged (Capabilities.Split): Settle writes their outcome
// later, unless another claim took them since.
func (c *claim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if c.once {
		return nil
	}
	c.once = true
	left, err := c.ss.apply(ctx, c.es, p)
	if len(left) > 0 {
		c.left = make(map[*entry]bool, len(left))
		for _, e := range left {
			c.left[e] = true
		}
		c.ss.q.giveBack(left)
	}
	return err
}

// Settle implements outboxdriver.Settler: p's outcome for events Complete left out,
// applied to those still waiting in the queue as Complete left them. An event another
// claim holds now is left alone (at worst it is sent again), and so is one settled
// before.
func (c *claim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	named := make(map[string]bool, len(p.Published)+len(p.Failed))
	for _, id := range p.Published {
		named[id] = true
	}
	for _, f := range p.Failed {
		named[f.ID] = true
	}
	var want []*entry
	for e := range c.left {
		if named[e.row.ID] {
			want = append(want, e)
			delete(c.left, e)
		}
	}
	es := c.ss.q.takeBack(want)
	if len(es) == 0 {
		return nil
	}
	_, err := c.ss.apply(ctx, es, p)
	return err
}

// apply writes p's outcome for es: acknowledged events are done (their rows
// completed first), dead ones go to the dead letters, failed ones back to the queue
// for their retry time. It returns the events p does not name, untouched. When the
// dead letters refuse, the dead go back to the queue with the failed (tried again,
// never confirmed unsent), and the error is returned.
func (ss *session) apply(ctx context.Context, es []*entry, p *outboxdriver.CompleteParams) (left []*entry, err error) {
	// An id may be here twice (a replayed event whose first copy the stream sent
	// again after a restart): an outcome applies to every copy.
	byID := make(map[string][]*entry, len(es))
	for _, e := range es {
		byID[e.row.ID] = append(byID[e.row.ID], e)
	}
	var dead []deadEntry
	var back []*entry
	decided := make(map[*entry]bool, len(es))
	for _, f := range p.Failed {
		for _, e := range byID[f.ID] {
			if decided[e] {
				continue
			}
			decided[e] = true
			if f.CountAttempt {
				e.row.Attempts++
			}
			if f.Dead {
				dead = append(dead, deadEntry{e, f.Error, f.HoldKey})
				continue
			}
			e.availableAt, e.failed = f.RetryAt, true
			back = append(back, e)
		}
	}
	var acked []*entry
	for _, id := range p.Published {
		for _, e := range byID[id] {
			if !decided[e] {
				decided[e] = true
				acked = append(acked, e)
			}
		}
	}
	for _, e := range es {
		if !decided[e] {
			left = append(left, e)
		}
	}
	if err := ss.src.insertDead(ctx, dead); err != nil {
		for _, d := range dead {
			back = append(back, d.e)
		}
		ss.q.giveBack(back)
		ss.published(acked, p)
		return left, err
	}
	if len(dead) > 0 {
		ss.heldMu.Lock()
		for _, d := range dead {
			if d.hold {
				ss.held[aggregateKey(&d.e.row)] = true
			}
		}
		ss.heldMu.Unlock()
	}
	done := make([]*entry, 0, len(dead))
	for _, d := range dead {
		done = append(done, d.e)
	}
	ss.q.giveBack(back)
	ss.q.done(done)
	ss.published(acked, p)
	// Report now, before the relay sends its next batch. A failed write ends the
	// stream, and the relay steps down.
	if err := ss.t.st.sendStatus(false); err != nil {
		ss.src.log.Warn("pgcdc: could not report the confirmed position", "err", err)
	}
	return left, nil
}

// Listen implements outboxdriver.Source: the relay wakes up as soon as the stream
// queued something.
func (s *Source) Listen(ctx context.Context) (outboxdriver.Listener, error) {
	ss := s.current()
	if ss == nil {
		return nil, outboxdriver.ErrLeadershipLost
	}
	return listener{ss.q}, nil
}

type listener struct{ q *queue }

func (l listener) Wait(ctx context.Context) error {
	select {
	case <-l.q.avail:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cleanup implements outboxdriver.Source: the rows marked published before the
// cutoff, as the table store's cleanup (through the cleanup index), and the rows the
// stream carried but no mark reached (the stream, not the row, is what was relayed:
// rows written after the slot, past the backfill) older than the cutoff (through the
// unpublished rows' index). Never a row that waits for the backfill.
func (s *Source) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (int64, error) {
	ss := s.current()
	if ss == nil || ss.backfilling.Load() {
		return s.inner.Cleanup(ctx, p)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.qTable+` WHERE seq IN (
  (SELECT seq FROM `+s.qTable+` WHERE published_at IS NOT NULL AND published_at < $1 ORDER BY published_at LIMIT $2)
  UNION ALL
  (SELECT seq FROM `+s.qTable+` WHERE published_at IS NULL AND seq > $3 AND created_at < $1 ORDER BY seq LIMIT $2))`, p.Before, p.Limit, ss.backfillUntil)
	if err != nil {
		return 0, fmt.Errorf("pgcdc: cleanup: %w", interpret(err))
	}
	return tag.RowsAffected(), nil
}

// markedMax returns the highest seq of a marked row when the session first asked.
// Rows marked later are the session's own, which its stream does not send again:
// a backlog streamed after earlier rows were published costs one question, not one a
// batch.
func (ss *session) markedMax(ctx context.Context) (int64, error) {
	ss.resentMu.Lock()
	defer ss.resentMu.Unlock()
	if ss.markedSeqKnown {
		return ss.markedSeq, nil
	}
	if err := ss.src.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+ss.src.qTable+` WHERE published_at IS NOT NULL`).Scan(&ss.markedSeq); err != nil {
		return 0, fmt.Errorf("pgcdc: %w", interpret(err))
	}
	ss.markedSeqKnown = true
	return ss.markedSeq, nil
}

// backfillClaim is the table store's claim of rows written before the slot: its
// Complete completes them itself, and tells Completed so (the source
// CompletesLater for every claim).
type backfillClaim struct{ outboxdriver.Claim }

func (c backfillClaim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if err := c.Claim.Complete(ctx, p); err != nil {
		return err
	}
	if p.Completed != nil {
		p.Completed(p.Published)
	}
	return nil
}

// Settle implements outboxdriver.Settler with the table store's claim's, and tells
// Completed as Complete does.
func (c backfillClaim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	s, ok := c.Claim.(outboxdriver.Settler)
	if !ok {
		return fmt.Errorf("pgcdc: the table store's claims cannot be completed in parts: %w", outboxdriver.ErrNotSupported)
	}
	if err := s.Settle(ctx, p); err != nil {
		return err
	}
	if p.Completed != nil {
		p.Completed(p.Published)
	}
	return nil
}

// KeepAlive implements outboxdriver.ClaimKeeper with the table store's claim's.
func (c backfillClaim) KeepAlive(ctx context.Context) error {
	if k, ok := c.Claim.(outboxdriver.ClaimKeeper); ok {
		return k.KeepAlive(ctx)
	}
	return nil
}

// Release implements outboxdriver.Claim: the events go back, in order.
func (c *claim) Release(context.Context) error {
	if c.once {
		return nil
	}
	c.once = true
	c.ss.q.giveBack(c.es)
	return nil
}

func (listener) Close(context.Context) error { return nil }
