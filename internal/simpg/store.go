package simpg

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

// Store is the table store over the model: the PostgreSQL store's statements, as Go.
type Store struct {
	d  *Driver
	db *DB
}

var (
	_ outboxdriver.GroupStore = (*Store)(nil)
	_ outboxdriver.Completer  = (*Store)(nil)
)

// Capabilities implements outboxdriver.Source: what the PostgreSQL store honours.
func (s *Store) Capabilities() outboxdriver.Capabilities {
	return outboxdriver.Capabilities{
		Completions: []outboxdriver.Completion{outboxdriver.CompleteMark, outboxdriver.CompleteDelete, outboxdriver.CompleteArchive},
		Columns:     true, MaxSeq: true, Listen: true, Split: true,
	}
}

// Claim implements outboxdriver.Source as the PostgreSQL store claims: a transaction
// that holds the claim fence shared and idles for at most HoldTimeout, and the head
// rule's two reads, the candidates without locking, then FOR UPDATE SKIP LOCKED (in
// a group, only rows of the partitions still leased at the claimed epochs).
func (s *Store) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	tx, err := s.d.c.Begin(ctx)
	if err != nil {
		return nil, err
	}
	var t *table
	s.db.mu.Lock()
	err = tx.stmt(ctx)
	if err == nil {
		t, err = s.d.tableIn(s.db)
	}
	if err == nil {
		err = tx.advisoryXact(ctx, s.d.claimFence, false)
	}
	if err == nil {
		tx.idleTimeout = p.HoldTimeout
		for _, c := range p.Columns {
			if t.column(c) == nil {
				err = fmt.Errorf("%w: column o.%s does not exist (run `outbox migrate`)", outboxdriver.ErrSchemaBehind, c)
			}
		}
	}
	s.db.mu.Unlock()
	if err != nil {
		tx.rollback()
		return nil, err
	}
	c := &claim{s: s, t: t, tx: tx, group: p.Group}
	c.rows, err = outboxdriver.ClaimHeads(ctx, p, outboxdriver.ClaimQueries{
		Candidates: func(ctx context.Context, q *outboxdriver.ClaimParams, after int64, ahead []int64) ([]outboxdriver.Candidate, error) {
			s.db.mu.Lock()
			defer s.db.mu.Unlock()
			if err := tx.stmt(ctx); err != nil {
				return nil, err
			}
			return t.candidates(tx, q, after, ahead), nil
		},
		Lock: func(ctx context.Context, seqs []int64) ([]outboxdriver.Row, error) {
			s.db.mu.Lock()
			defer s.db.mu.Unlock()
			if err := tx.stmt(ctx); err != nil {
				return nil, err
			}
			held := t.heldPartitions(tx, p.Group)
			var out []outboxdriver.Row
			for _, r := range t.outbox {
				v := r.view(tx)
				if v == nil || v.published() || !slices.Contains(seqs, v.seq) || held != nil && !held[v.partition] {
					continue
				}
				if ok, err := tx.lock(ctx, r, ForUpdate, true); err != nil {
					return nil, err
				} else if ok {
					out = append(out, t.outboxRow(v, p.Columns))
				}
			}
			return out, nil
		},
	})
	if err != nil {
		tx.rollback()
		return nil, err
	}
	if len(c.rows) == 0 {
		tx.rollback()
		c.tx = nil
	}
	return c, nil
}

// candidates is the claim's first read (under db.mu): the due, unpublished rows not
// behind a failing row of their aggregate, nor behind a dead letter holding it, in
// seq order.
func (t *table) candidates(tx *Tx, q *outboxdriver.ClaimParams, after int64, ahead []int64) []outboxdriver.Candidate {
	t.outbox = vacuum(t.outbox)
	failing := map[outboxdriver.Aggregate]int64{} // the first failing row's seq
	for _, r := range t.outbox {
		if v := r.view(tx); v != nil && !v.published() && v.attempts > 0 {
			if first, ok := failing[v.aggregate()]; !ok || v.seq < first {
				failing[v.aggregate()] = v.seq
			}
		}
	}
	held := map[outboxdriver.Aggregate]bool{}
	for _, r := range t.dead {
		if v := r.view(tx); v != nil && v.holdsKey {
			held[v.aggregate()] = true
		}
	}
	var parts map[int]bool
	if q.Group != nil {
		parts = map[int]bool{}
		for _, l := range q.Group.Leases {
			parts[l.Partition] = true
		}
	}
	var out []outboxdriver.Candidate
	for _, r := range t.outbox {
		v := r.view(tx)
		switch {
		case v == nil || v.published() || v.availableAt.After(tx.start) || q.MaxSeq > 0 && v.seq > q.MaxSeq || v.seq <= after:
			continue
		case parts != nil && !parts[v.partition], slices.Contains(ahead, v.seq), slices.Contains(q.Skip, v.aggregate()):
			continue
		case held[v.aggregate()]:
			continue
		}
		if first, ok := failing[v.aggregate()]; ok && first < v.seq {
			continue
		}
		out = append(out, outboxdriver.Candidate{Seq: v.seq, Aggregate: v.aggregate(), Bytes: len(v.payload)})
	}
	slices.SortFunc(out, func(a, b outboxdriver.Candidate) int { return int(a.Seq - b.Seq) })
	if len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out
}

// heldPartitions are the partitions still leased to g's relay at the epochs it claims
// under, as tx sees the leases (nil: no group, every partition).
func (t *table) heldPartitions(tx *Tx, g *outboxdriver.ClaimGroup) map[int]bool {
	if g == nil {
		return nil
	}
	held := map[int]bool{}
	for _, l := range g.Leases {
		if l.Partition < len(t.leases) && t.leaseHeld(t.leases[l.Partition].view(tx), g.RelayID, l.Epoch, tx.start) {
			held[l.Partition] = true
		}
	}
	return held
}

func (t *table) leaseHeld(v *rec, owner string, epoch int64, now time.Time) bool {
	return v != nil && v.owner == owner && v.epoch == epoch && v.leaseUntil.After(now)
}

// fence is the write-back's "held" CTE: the partitions still leased to the relay at
// its epochs, their lease rows locked FOR SHARE, so a takeover waits for this
// write-back, or this write-back sees the takeover and applies to nothing (nil: no
// group).
func (t *table) fence(ctx context.Context, tx *Tx, g *outboxdriver.ClaimGroup) (map[int]bool, error) {
	if g == nil {
		return nil, nil
	}
	held := map[int]bool{}
	for _, l := range g.Leases {
		if l.Partition >= len(t.leases) {
			continue
		}
		r := t.leases[l.Partition]
		if !t.leaseHeld(r.view(tx), g.RelayID, l.Epoch, tx.start) {
			continue
		}
		if _, err := tx.lock(ctx, r, ForShare, false); err != nil {
			return nil, err
		}
		if t.leaseHeld(r.view(tx), g.RelayID, l.Epoch, tx.start) {
			held[l.Partition] = true
		}
	}
	return held, nil
}

type claim struct {
	s     *Store
	t     *table
	tx    *Tx
	rows  []outboxdriver.Row
	group *outboxdriver.ClaimGroup
}

func (c *claim) Rows() []outboxdriver.Row { return c.rows }

// KeepAlive implements outboxdriver.ClaimKeeper: a statement resets the server's
// idle-in-transaction clock.
func (c *claim) KeepAlive(ctx context.Context) error {
	if c.tx == nil {
		return nil
	}
	c.s.db.mu.Lock()
	defer c.s.db.mu.Unlock()
	return c.tx.stmt(ctx)
}

// Complete implements outboxdriver.Claim: the write-back in the claim's transaction,
// or, when that transaction ended or failed, settled in a fresh one.
func (c *claim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if c.tx == nil {
		return nil
	}
	tx := c.tx
	c.tx = nil
	c.s.db.mu.Lock()
	err := tx.stmt(ctx)
	if err == nil {
		err = c.write(ctx, tx, p)
	}
	c.s.db.mu.Unlock()
	if err == nil {
		if err = tx.commit(ctx); err == nil {
			return nil
		}
	} else {
		tx.rollback()
	}
	if ctx.Err() != nil {
		return err
	}
	// A single active relay's failure record waits (a while) for every claim in
	// flight to end, as the PostgreSQL store's settleFence: exclusive.
	exclusive := len(p.Failed) > 0 && c.group == nil
	if serr := outboxdriver.Settle(ctx, p, func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		return c.settleTx(ctx, p, exclusive)
	}); serr != nil {
		return fmt.Errorf("%w (settling in a fresh transaction: %w)", err, serr)
	}
	return c.unpublished(ctx, p.Published)
}

// unpublished fails with ErrNotCompleted when rows of ids are still unpublished after
// a settle (its SKIP LOCKED passed rows another session held).
func (c *claim) unpublished(ctx context.Context, ids []string) error {
	n := 0
	err := c.s.read(ctx, func(t *table, _ time.Time) {
		for _, r := range t.outbox {
			if v := r.committed; v != nil && !v.published() && slices.Contains(ids, v.id) {
				n++
			}
		}
	})
	if err == nil && n > 0 {
		err = fmt.Errorf("%w: %d of %d (another session held them when the claim's transaction had ended)", outboxdriver.ErrNotCompleted, n, len(ids))
	}
	return err
}

// Settle implements outboxdriver.Settler, under the claim fence shared.
func (c *claim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	return outboxdriver.Settle(ctx, p, func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		return c.settleTx(ctx, p, false)
	})
}

// settleTx applies p, restricted to the rows still unpublished, held by no claim and
// untouched since the claim, in a transaction of its own under the claim fence.
func (c *claim) settleTx(ctx context.Context, p *outboxdriver.CompleteParams, exclusive bool) error {
	tx, err := c.s.d.c.Begin(ctx)
	if err != nil {
		return err
	}
	db := c.s.db
	db.mu.Lock()
	err = tx.stmt(ctx)
	if err == nil {
		if exclusive {
			tx.lockTimeout = 2 * time.Second
		}
		err = tx.advisoryXact(ctx, c.s.d.claimFence, exclusive)
	}
	if err == nil {
		ids := p.IDs()
		current := map[string]int{}
		for _, r := range c.t.outbox {
			v := r.view(tx)
			if v == nil || v.published() || !slices.Contains(ids, v.id) {
				continue
			}
			var ok bool
			if ok, err = tx.lock(ctx, r, ForUpdate, true); err != nil {
				break
			}
			if ok {
				current[v.id] = v.attempts
			}
		}
		if err == nil {
			err = c.write(ctx, tx, p.Restrict(c.rows, current))
		}
	}
	db.mu.Unlock()
	if err != nil {
		tx.rollback()
		return err
	}
	return tx.commit(ctx)
}

// write applies p in tx (under db.mu): the published rows marked, deleted or
// archived, the failures recorded, the dead moved; in a group, only in the
// partitions still leased at the claimed epochs.
func (c *claim) write(ctx context.Context, tx *Tx, p *outboxdriver.CompleteParams) error {
	t := c.t
	held, err := t.fence(ctx, tx, c.group)
	if err != nil {
		return err
	}
	in := func(v *rec) bool { return held == nil || held[v.partition] }
	if len(p.Published) > 0 {
		if err := t.completePublished(ctx, tx, p.Published, p.Completion, in); err != nil {
			return err
		}
	}
	for _, f := range p.Failed {
		r := t.byID(tx, f.ID)
		if r == nil || !in(r.view(tx)) {
			continue
		}
		if _, err := tx.lock(ctx, r, ForUpdate, false); err != nil {
			return err
		}
		v := r.view(tx)
		if v == nil || !in(v) {
			continue
		}
		n := 0
		if f.CountAttempt {
			n = 1
		}
		if f.Dead {
			d := v.clone()
			d.attempts += n
			d.deadAt, d.deadError, d.holdsKey = tx.start, f.Error, f.HoldKey
			tx.set(r, nil)
			t.dead = append(t.dead, tx.insert(d))
			continue
		}
		nv := v.clone()
		nv.attempts += n
		nv.lastError = f.Error
		if !f.RetryAt.IsZero() {
			nv.availableAt = f.RetryAt.Truncate(time.Microsecond)
		}
		tx.set(r, nv)
	}
	return nil
}

// byID is the outbox row with id as tx sees it (nil: none).
func (t *table) byID(tx *Tx, id string) *row {
	for _, r := range t.outbox {
		if v := r.view(tx); v != nil && v.id == id {
			return r
		}
	}
	return nil
}

// completePublished marks, deletes or archives the rows of ids that in accepts,
// published or not (the PostgreSQL statements filter on id alone).
func (t *table) completePublished(ctx context.Context, tx *Tx, ids []string, how outboxdriver.Completion, in func(*rec) bool) error {
	for _, id := range ids {
		r := t.byID(tx, id)
		if r == nil || !in(r.view(tx)) {
			continue
		}
		m := ForNoKeyUpdate
		gone := how == outboxdriver.CompleteDelete || how == outboxdriver.CompleteArchive
		if gone {
			m = ForUpdate
		}
		if _, err := tx.lock(ctx, r, m, false); err != nil {
			return err
		}
		v := r.view(tx)
		if v == nil || !in(v) {
			continue
		}
		if !gone {
			nv := v.clone()
			nv.publishedAt, nv.lastError = tx.start, ""
			tx.set(r, nv)
			continue
		}
		tx.set(r, nil)
		if how == outboxdriver.CompleteArchive {
			a := v.clone()
			a.publishedAt = tx.start
			t.archive = append(t.archive, tx.insert(a))
		}
	}
	return nil
}

// Release implements outboxdriver.Claim.
func (c *claim) Release(context.Context) error {
	if c.tx != nil {
		c.tx.rollback()
		c.tx = nil
	}
	return nil
}

// CompletePublished implements outboxdriver.Completer, unfenced.
func (s *Store) CompletePublished(ctx context.Context, ids []string, how outboxdriver.Completion) error {
	if len(ids) == 0 {
		return nil
	}
	return s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		return t.completePublished(ctx, tx, ids, how, func(*rec) bool { return true })
	})
}

// AcquireLeadership implements outboxdriver.Source: a session advisory lock on a
// session of its own, ended by the server once it idles for params.Timeout; then a
// wait until no claim holds the claim fence (a previous leader's claims can outlive
// its lock's session).
func (s *Store) AcquireLeadership(ctx context.Context, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	var timeout time.Duration
	if params != nil {
		timeout = params.Timeout
	}
	return s.advisory(ctx, true, timeout)
}

// AcquireMembership implements outboxdriver.GroupStore: the same lock, shared.
func (s *Store) AcquireMembership(ctx context.Context) (outboxdriver.Leadership, error) {
	return s.advisory(ctx, false, 0)
}

func (s *Store) advisory(ctx context.Context, exclusive bool, timeout time.Duration) (outboxdriver.Leadership, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	db.reap()
	sess, err := db.open(s.d.c)
	if err != nil {
		return nil, err
	}
	sess.idleSession = timeout
	if !db.tryAdvisory(s.d.lockKey, sess, exclusive) {
		db.terminate(sess)
		return nil, nil
	}
	if exclusive {
		// pg_advisory_lock(fence), pg_advisory_unlock(fence), on the lock's session.
		if !db.grantable(s.d.claimFence, sess, true, nil) {
			db.counts["leader-waited-for-claims"]++
		}
		tx := &Tx{db: db, s: sess, start: now()}
		sess.tx = tx
		err := tx.advisoryXact(ctx, s.d.claimFence, true)
		db.endTx(tx, false)
		if err != nil {
			db.terminate(sess)
			return nil, fmt.Errorf("waiting for the previous leader's claims to end: %w", err)
		}
	}
	return &leadership{db: db, s: sess, key: s.d.lockKey}, nil
}

type leadership struct {
	db  *DB
	s   *session
	key int64
}

// Check implements outboxdriver.Leadership: a live session means the lock is held.
func (l *leadership) Check(ctx context.Context) error {
	l.db.mu.Lock()
	defer l.db.mu.Unlock()
	l.db.reap()
	if l.s.closed {
		return fmt.Errorf("%w: %w", outboxdriver.ErrLeadershipLost, ErrSessionEnded)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.s.last = time.Now()
	return nil
}

// Release implements outboxdriver.Leadership.
func (l *leadership) Release(context.Context) error {
	l.db.mu.Lock()
	defer l.db.mu.Unlock()
	if !l.s.closed {
		l.db.unlockAdvisory(l.key, l.s)
		l.db.terminate(l.s)
	}
	return nil
}

// Listen implements outboxdriver.Source.
func (s *Store) Listen(ctx context.Context) (outboxdriver.Listener, error) {
	s.db.mu.Lock()
	t, err := s.d.tableIn(s.db)
	s.db.mu.Unlock()
	if err != nil {
		return nil, err
	}
	l := &listener{t: t, bell: make(chan struct{}, 1)}
	t.lmu.Lock()
	t.listeners[l] = struct{}{}
	t.lmu.Unlock()
	return l, ctx.Err()
}

func (l *listener) Wait(ctx context.Context) error {
	select {
	case <-l.bell:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *listener) Close(context.Context) error {
	l.t.lmu.Lock()
	delete(l.t.listeners, l)
	l.t.lmu.Unlock()
	return nil
}

// Cleanup implements outboxdriver.Source: published rows older than p.Before, then
// archived ones, at most p.Limit of each.
func (s *Store) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (int64, error) {
	var n int64
	err := s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		for _, rows := range [][]*row{t.outbox, t.archive} {
			left := p.Limit
			for _, r := range rows {
				v := r.view(tx)
				if left <= 0 || v == nil || !v.published() || !v.publishedAt.Before(p.Before) {
					continue
				}
				ok, err := tx.write(ctx, r, nil)
				if err != nil {
					return err
				}
				if ok {
					n++
					left--
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.db.mu.Lock()
	if t, err := s.d.tableIn(s.db); err == nil {
		t.archive = vacuum(t.archive)
	}
	s.db.mu.Unlock()
	return n, nil
}
