package simpg

import (
	"context"
	"fmt"

	"github.com/outboxd/outbox/outboxdriver"
)

// HoldRow holds the outbox row of event id with lock mode m from a transaction of
// c's, as an operator's open transaction or another tool would (update: the row was
// updated, not only locked), until release is called.
func (c *Client) HoldRow(ctx context.Context, t outboxdriver.Table, id string, m LockMode, update bool) (release func(), err error) {
	return c.hold(ctx, t, m, update, false, func(v *rec, _ int) bool { return v.id == id }, nil)
}

// HoldOldest holds the n oldest unpublished rows of t that no one else locks, with
// lock mode m (a reporting job's SELECT … FOR SHARE SKIP LOCKED over the backlog;
// update: an UPDATE of them left uncommitted), and returns their seqs.
func (c *Client) HoldOldest(ctx context.Context, t outboxdriver.Table, n int, m LockMode, update bool) (seqs []int64, release func(), err error) {
	release, err = c.hold(ctx, t, m, update, true, func(v *rec, taken int) bool {
		return taken < n && !v.published()
	}, func(v *rec) { seqs = append(seqs, v.seq) })
	return seqs, release, err
}

// hold locks, in a transaction of c's, the rows pick picks (skip: SKIP LOCKED) and
// tells took of each.
func (c *Client) hold(ctx context.Context, t outboxdriver.Table, m LockMode, update, skip bool, pick func(v *rec, taken int) bool, took func(*rec)) (func(), error) {
	tx, err := c.Begin(ctx)
	if err != nil {
		return nil, err
	}
	db := c.db
	db.mu.Lock()
	err = tx.stmt(ctx)
	var tb *table
	if err == nil {
		tb = db.tables[t.WithDefaults().String()]
		if tb == nil {
			err = fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, t)
		}
	}
	taken := 0
	if err == nil {
		for _, r := range tb.outbox {
			v := r.view(tx)
			if v == nil || !pick(v, taken) {
				continue
			}
			var ok bool
			if ok, err = tx.lock(ctx, r, m, skip); err != nil {
				break
			}
			if !ok {
				continue
			}
			taken++
			if took != nil {
				took(v)
			}
			if update {
				tx.set(r, r.view(tx).clone())
			}
		}
	}
	db.mu.Unlock()
	if err != nil {
		tx.rollback()
		return nil, err
	}
	return tx.rollback, nil
}

func (m LockMode) String() string {
	return [...]string{"?", "FOR KEY SHARE", "FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE"}[m]
}

// Dump is every row of t's outbox and dead letters as committed, a line each (a
// failed simulation's story).
func (db *DB) Dump(t outboxdriver.Table) []string {
	db.mu.Lock()
	defer db.mu.Unlock()
	tb := db.tables[t.WithDefaults().String()]
	if tb == nil {
		return nil
	}
	var out []string
	for _, r := range tb.outbox {
		if v := r.committed; v != nil {
			out = append(out, fmt.Sprintf("outbox seq=%d %s published=%v attempts=%d available=%s %.60s",
				v.seq, v.id, v.published(), v.attempts, v.availableAt.Format("15:04:05.000"), v.lastError))
		}
	}
	for _, r := range tb.dead {
		if v := r.committed; v != nil {
			out = append(out, fmt.Sprintf("dead seq=%d %s attempts=%d holds=%v %.60s", v.seq, v.id, v.attempts, v.holdsKey, v.deadError))
		}
	}
	return out
}
