package simpg

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// read runs fn as one statement outside any transaction (it sees what is committed).
func (s *Store) read(ctx context.Context, fn func(t *table, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	s.db.reap()
	t, err := s.d.tableIn(s.db)
	if err != nil {
		return err
	}
	fn(t, now())
	return nil
}

// Status implements outboxdriver.Admin.
func (s *Store) Status(ctx context.Context) (*outboxdriver.Status, error) {
	st := &outboxdriver.Status{Table: s.d.table.String()}
	err := s.read(ctx, func(t *table, now time.Time) {
		var oldest time.Time
		firstPublished := func(at time.Time) {
			if st.OldestPublished.IsZero() || at.Before(st.OldestPublished) {
				st.OldestPublished = at
			}
		}
		for _, r := range t.outbox {
			v := r.committed
			switch {
			case v == nil:
			case v.published():
				st.Published++
				firstPublished(v.publishedAt)
			default:
				st.Unpublished++
				if v.attempts > 0 {
					st.Failing++
				}
				if oldest.IsZero() || v.createdAt.Before(oldest) {
					oldest = v.createdAt
				}
			}
		}
		for _, r := range t.archive {
			if v := r.committed; v != nil {
				st.Published++
				firstPublished(v.publishedAt)
			}
		}
		if !oldest.IsZero() {
			st.OldestAge = max(now.Sub(oldest), time.Microsecond)
		}
		held := map[outboxdriver.Aggregate]bool{}
		for _, r := range t.dead {
			if v := r.committed; v != nil {
				st.Dead++
				if v.holdsKey {
					held[v.aggregate()] = true
				}
			}
		}
		st.HeldKeys = int64(len(held))
		for i, h := range s.db.holders(s.d.lockKey) {
			if !h.exclusive {
				st.ActiveRelay = fmt.Sprintf("%d relays in a group (see below)", i+1)
			} else {
				st.ActiveRelay = fmt.Sprintf("%v (simulated)", h.s)
			}
			if i == 0 {
				st.ActiveSince = h.s.started
			}
		}
		s.groupStatus(t, st, now)
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// groupStatus fills a group's relays and the backlog per partition (nothing when no
// relay ever registered).
func (s *Store) groupStatus(t *table, st *outboxdriver.Status, now time.Time) {
	if len(t.relays) == 0 {
		return
	}
	for _, id := range slices.Sorted(maps.Keys(t.relays)) {
		r := t.relays[id]
		rs := outboxdriver.RelayStatus{ID: id, Info: r.info, HeartbeatAge: now.Sub(r.heartbeat)}
		var first time.Time
		for _, l := range t.leases {
			if v := l.committed; v.owner == id && v.leaseUntil.After(now) {
				rs.Partitions = append(rs.Partitions, v.partition)
				if first.IsZero() || v.leaseAcquired.Before(first) {
					first = v.leaseAcquired
				}
			}
		}
		if !first.IsZero() {
			rs.OldestLease = now.Sub(first)
		}
		st.Relays = append(st.Relays, rs)
	}
	st.PartitionBacklog = make([]int64, len(t.leases))
	for _, r := range t.outbox {
		if v := r.committed; v != nil && !v.published() {
			st.PartitionBacklog[v.partition]++
		}
	}
}

// deadMatch selects dead letters by f, as the PostgreSQL store's WHERE clause: an id
// that is not a UUID names none.
func deadMatch(f *outboxdriver.DeadFilter, now time.Time) func(*rec) bool {
	if f == nil {
		f = &outboxdriver.DeadFilter{}
	}
	var ids []string
	for _, id := range f.IDs {
		if u, err := uuid.Parse(id); err == nil {
			ids = append(ids, u.String())
		}
	}
	return func(v *rec) bool {
		return (len(f.IDs) == 0 || slices.Contains(ids, v.id)) &&
			(f.AggregateType == "" || v.aggType == f.AggregateType) && (f.AggregateID == "" || v.aggID == f.AggregateID) &&
			(f.Type == "" || v.typ == f.Type) && !v.deadAt.After(now.Add(-f.OlderThan))
	}
}

// selectDead is the dead letters f selects, as tx sees them, in seq order (or dead_at
// order), at most f.Limit.
func (t *table) selectDead(tx *Tx, f *outboxdriver.DeadFilter, byDeadAt bool) []*row {
	match := deadMatch(f, tx.start)
	var out []*row
	for _, r := range t.dead {
		if v := r.view(tx); v != nil && match(v) {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b *row) int {
		va, vb := a.view(tx), b.view(tx)
		if byDeadAt && !va.deadAt.Equal(vb.deadAt) {
			return va.deadAt.Compare(vb.deadAt)
		}
		return int(va.seq - vb.seq)
	})
	if f != nil && f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out
}

// ListDead implements outboxdriver.Admin.
func (s *Store) ListDead(ctx context.Context, f *outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	var out []outboxdriver.DeadLetter
	err := s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		for _, r := range t.selectDead(tx, f, true) {
			v := r.view(tx)
			d := outboxdriver.DeadLetter{Row: t.outboxRow(v, nil), Error: v.deadError, DeadAt: v.deadAt, HoldsKey: v.holdsKey}
			if f != nil {
				d.CutPayload(f.PayloadMax)
			}
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

// behind are the dead letters waiting behind a holding dead letter of sel (the CDC
// source's outboxdriver.WaitingBehindDeadLetter): they go back with it.
func (t *table) behind(tx *Tx, sel []*row) []*row {
	var out []*row
	for _, w := range t.dead {
		wv := w.view(tx)
		if wv == nil || wv.holdsKey || wv.deadError != outboxdriver.WaitingBehindDeadLetter {
			continue
		}
		for _, h := range sel {
			if hv := h.view(tx); hv.holdsKey && hv.aggregate() == wv.aggregate() && wv.seq > hv.seq {
				out = append(out, w)
				break
			}
		}
	}
	return out
}

// backToOutbox moves dead letters back into the outbox with their seq, due at their
// write time; one that held nothing back goes marked late (its aggregate went on
// past it).
func (t *table) backToOutbox(ctx context.Context, tx *Tx, rows []*row) (int, error) {
	n := 0
	for _, r := range rows {
		if _, err := tx.lock(ctx, r, ForUpdate, false); err != nil {
			return n, err
		}
		v := r.view(tx)
		if v == nil {
			continue
		}
		o := v.clone()
		o.attempts, o.lastError, o.availableAt, o.deadAt, o.deadError, o.holdsKey = 0, "", v.createdAt, time.Time{}, "", false
		if !v.holdsKey && v.deadError != outboxdriver.WaitingBehindDeadLetter {
			h := map[string]any{}
			if v.headers != nil {
				_ = json.Unmarshal(v.headers, &h)
			}
			h[wire.HeaderLate] = wire.LateReplayed
			o.headers, _ = json.Marshal(h)
		}
		if len(t.columns) > 0 {
			o.cols = map[string]*string{}
			for _, c := range t.columns {
				o.cols[c.name] = c.def
			}
		}
		tx.set(r, nil)
		t.outbox = insertSorted(t.outbox, tx.insert(o), o.seq)
		n++
	}
	return n, nil
}

// ReplayDead implements outboxdriver.Admin.
func (s *Store) ReplayDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	var n int
	err := s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		sel := t.selectDead(tx, f, false)
		picked := append(slices.Clone(sel), t.behind(tx, sel)...)
		slices.SortFunc(picked, func(a, b *row) int { return int(a.view(tx).seq - b.view(tx).seq) })
		picked = slices.Compact(picked)
		var err error
		n, err = t.backToOutbox(ctx, tx, picked)
		return err
	})
	return n, err
}

// PurgeDead implements outboxdriver.Admin: the selected dead letters go, and those
// waiting behind them go back to the outbox.
func (s *Store) PurgeDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	var n int
	err := s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		sel := t.selectDead(tx, f, false)
		behind := t.behind(tx, sel)
		for _, r := range sel {
			if slices.Contains(behind, r) {
				continue
			}
			ok, err := tx.write(ctx, r, nil)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		_, err := t.backToOutbox(ctx, tx, behind)
		return err
	})
	return n, err
}

// EditDead implements outboxdriver.Admin.
func (s *Store) EditDead(ctx context.Context, id string, e *outboxdriver.DeadEdit) error {
	u, err := uuid.Parse(id)
	if err != nil {
		return fmt.Errorf("%w: %q is not a UUID", outboxdriver.ErrEventNotFound, id)
	}
	headers, err := e.HeadersJSON()
	if err != nil {
		return err
	}
	found := false
	err = s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		for _, r := range t.dead {
			v := r.view(tx)
			if v == nil || v.id != u.String() {
				continue
			}
			nv := v.clone()
			if e.Payload != nil {
				nv.payload = slices.Clone(e.Payload)
			}
			if headers != nil {
				nv.headers = headers
			}
			ok, err := tx.write(ctx, r, nv)
			found = found || ok
			return err
		}
		return nil
	})
	if err == nil && !found {
		return fmt.Errorf("%w: no dead letter %s", outboxdriver.ErrEventNotFound, id)
	}
	return err
}

// RetryNow implements outboxdriver.Admin.
func (s *Store) RetryNow(ctx context.Context, f *outboxdriver.WaitFilter) (int, error) {
	if f == nil {
		f = &outboxdriver.WaitFilter{}
	}
	var n int
	err := s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		for _, r := range t.outbox {
			v := r.view(tx)
			if v == nil || v.published() || v.attempts == 0 || !v.availableAt.After(tx.start) ||
				len(f.IDs) > 0 && !slices.Contains(f.IDs, v.id) || f.AggregateType != "" && v.aggType != f.AggregateType ||
				f.AggregateID != "" && v.aggID != f.AggregateID {
				continue
			}
			nv := v.clone()
			nv.availableAt = tx.start
			ok, err := tx.write(ctx, r, nv)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return nil
	})
	return n, err
}

// Event implements outboxdriver.Admin: the outbox, the archive, then the dead letters.
func (s *Store) Event(ctx context.Context, id string) (*outboxdriver.EventInfo, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return nil, fmt.Errorf("%w: %q is not a UUID", outboxdriver.ErrEventNotFound, id)
	}
	var e *outboxdriver.EventInfo
	err = s.read(ctx, func(t *table, _ time.Time) {
		find := func(rows []*row) *rec {
			for _, r := range rows {
				if v := r.committed; v != nil && v.id == u.String() {
					return v
				}
			}
			return nil
		}
		if v := find(t.outbox); v != nil {
			e = &outboxdriver.EventInfo{Row: t.outboxRow(v, nil), State: outboxdriver.EventWaiting, Error: v.lastError}
			if v.published() {
				e.State, e.PublishedAt = outboxdriver.EventPublished, v.publishedAt
			} else if v.availableAt.After(v.createdAt) {
				e.AvailableAt = v.availableAt
			}
		} else if v := find(t.archive); v != nil {
			e = &outboxdriver.EventInfo{Row: t.outboxRow(v, nil), State: outboxdriver.EventPublished, PublishedAt: v.publishedAt, Archived: true}
		} else if v := find(t.dead); v != nil {
			e = &outboxdriver.EventInfo{Row: t.outboxRow(v, nil), State: outboxdriver.EventDead, Error: v.deadError, DeadAt: v.deadAt, HoldsKey: v.holdsKey}
		}
	})
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, fmt.Errorf("%w: %s", outboxdriver.ErrEventNotFound, id)
	}
	return e, nil
}

// Heartbeat implements outboxdriver.GroupStore.
func (s *Store) Heartbeat(ctx context.Context, p *outboxdriver.HeartbeatParams) (*outboxdriver.Membership, error) {
	m := &outboxdriver.Membership{}
	err := s.read(ctx, func(t *table, now time.Time) {
		t.relays[p.RelayID] = &relay{info: p.Info, heartbeat: now}
		for id, r := range t.relays {
			if r.heartbeat.Before(now.Add(-10 * p.TTL)) {
				delete(t.relays, id)
			}
		}
		for _, id := range slices.Sorted(maps.Keys(t.relays)) {
			if t.relays[id].heartbeat.After(now.Add(-p.TTL)) {
				m.Relays = append(m.Relays, id)
			}
		}
		m.Partitions = len(t.leases)
	})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Leases implements outboxdriver.GroupStore, in one transaction: the leases given up,
// then those renewed or taken (a partition changing hands gets a new epoch). A lease
// row a write-back holds FOR SHARE is waited for.
func (s *Store) Leases(ctx context.Context, p *outboxdriver.LeaseParams) ([]outboxdriver.Lease, error) {
	var out []outboxdriver.Lease
	err := s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		for _, r := range t.leases {
			v := r.view(tx)
			if v.owner != p.RelayID || slices.Contains(p.Want, v.partition) {
				continue
			}
			if _, err := tx.lock(ctx, r, ForNoKeyUpdate, false); err != nil {
				return err
			}
			if v = r.view(tx); v.owner == p.RelayID {
				nv := v.clone()
				nv.owner, nv.leaseUntil = "", time.Time{}
				tx.set(r, nv)
			}
		}
		takes := func(v *rec) bool {
			return slices.Contains(p.Want, v.partition) && (v.owner == p.RelayID || v.owner == "" || v.leaseUntil.Before(tx.start))
		}
		for _, r := range t.leases {
			if !takes(r.view(tx)) {
				continue
			}
			if _, err := tx.lock(ctx, r, ForNoKeyUpdate, false); err != nil {
				return err
			}
			v := r.view(tx)
			if !takes(v) {
				continue
			}
			nv := v.clone()
			if v.owner != p.RelayID {
				nv.epoch++
				nv.leaseAcquired = tx.start
			}
			nv.owner, nv.leaseUntil = p.RelayID, tx.start.Add(p.TTL)
			tx.set(r, nv)
			out = append(out, outboxdriver.Lease{Partition: nv.partition, Epoch: nv.epoch})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Barrier implements outboxdriver.GroupStore: it locks every unpublished row of the
// partitions, waiting behind any claim holding some (until ctx's deadline, as
// lock_timeout), then lets them go.
func (s *Store) Barrier(ctx context.Context, partitions []int) error {
	if len(partitions) == 0 {
		return nil
	}
	tx, err := s.d.c.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.rollback()
	s.db.mu.Lock()
	defer s.db.mu.Unlock()
	if err := tx.stmt(ctx); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		tx.lockTimeout = max(time.Until(dl), time.Millisecond)
	}
	t, err := s.d.tableIn(s.db)
	if err != nil {
		return err
	}
	for _, r := range slices.Clone(t.outbox) {
		if v := r.view(tx); v == nil || v.published() || !slices.Contains(partitions, v.partition) {
			continue
		}
		if !r.free(tx, ForUpdate) {
			s.db.counts["barrier-waited"]++
		}
		if _, err := tx.lock(ctx, r, ForUpdate, false); err != nil {
			return fmt.Errorf("partitions %v still locked by a previous owner: %w", partitions, err)
		}
	}
	return nil
}

// Leave implements outboxdriver.GroupStore.
func (s *Store) Leave(ctx context.Context, relayID string) error {
	return s.d.autocommit(ctx, func(tx *Tx, t *table) error {
		delete(t.relays, relayID)
		for _, r := range t.leases {
			if r.view(tx).owner != relayID {
				continue
			}
			if _, err := tx.lock(ctx, r, ForNoKeyUpdate, false); err != nil {
				return err
			}
			if v := r.view(tx); v.owner == relayID {
				nv := v.clone()
				nv.owner, nv.leaseUntil = "", time.Time{}
				tx.set(r, nv)
			}
		}
		return nil
	})
}
