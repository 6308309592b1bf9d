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
	return c.hold(ctx, t, m, update, func(v *rec, _ int) bool { return v.id == id })
}

// HoldOldest holds the n oldest unpublished rows of t with lock mode m (a reporting
// job's SELECT … FOR SHARE over the backlog), waiting for rows others lock, and
// returns their seqs.
func (c *Client) HoldOldest(ctx context.Context, t outboxdriver.Table, n int, m LockMode) (seqs []int64, release func(), err error) {
	release, err = c.hold(ctx, t, m, false, func(v *rec, taken int) bool {
		if taken < n && !v.published() {
			seqs = append(seqs, v.seq)
			return true
		}
		return false
	})
	return seqs, release, err
}

func (c *Client) hold(ctx context.Context, t outboxdriver.Table, m LockMode, update bool, pick func(v *rec, taken int) bool) (func(), error) {
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
			if _, err = tx.lock(ctx, r, m, false); err != nil {
				break
			}
			taken++
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
