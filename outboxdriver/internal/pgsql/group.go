package pgsql

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

var _ outboxdriver.GroupStore = (*Store)(nil)

func interval(d time.Duration) string {
	return strconv.FormatInt(d.Microseconds(), 10) + " microseconds"
}

// Heartbeat implements outboxdriver.GroupStore.
func (s *Store) Heartbeat(ctx context.Context, p *outboxdriver.HeartbeatParams) (*outboxdriver.Membership, error) {
	err := s.DB.Exec(ctx, `INSERT INTO `+s.Statements.relays+` (id, info) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), info = excluded.info`, p.RelayID, p.Info)
	if err != nil {
		return nil, InterpretError(err)
	}
	// A relay that died without leaving stays listed (in `outbox status`) for a while.
	if err := s.DB.Exec(ctx, `DELETE FROM `+s.Statements.relays+` WHERE heartbeat_at < now() - $1::interval`, interval(10*p.TTL)); err != nil {
		return nil, InterpretError(err)
	}
	rows, err := s.DB.Query(ctx, `SELECT id, (SELECT count(*) FROM `+s.Statements.leases+`) FROM `+s.Statements.relays+`
WHERE heartbeat_at > now() - $1::interval ORDER BY id`, interval(p.TTL))
	if err != nil {
		return nil, InterpretError(err)
	}
	defer rows.Close()
	m := &outboxdriver.Membership{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id, &m.Partitions); err != nil {
			return nil, InterpretError(err)
		}
		m.Relays = append(m.Relays, id)
	}
	return m, InterpretError(rows.Err())
}

// Leases implements outboxdriver.GroupStore, in one transaction: give up what is no
// longer wanted, then renew or take the wanted partitions whose lease is ours, free or
// expired. A partition changing hands gets a new epoch, which fences the old owner's
// write-backs.
func (s *Store) Leases(ctx context.Context, p *outboxdriver.LeaseParams) ([]outboxdriver.Lease, error) {
	want := make([]int16, len(p.Want))
	for i, w := range p.Want {
		want[i] = int16(w)
	}
	tx, err := s.DB.Begin(ctx)
	if err != nil {
		return nil, InterpretError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := boundTx(ctx, tx, ""); err != nil {
		return nil, InterpretError(err)
	}
	if err := tx.Exec(ctx, `UPDATE `+s.Statements.leases+` SET owner = NULL, lease_until = '-infinity'
WHERE owner = $1 AND NOT (partition = ANY($2::smallint[]))`, p.RelayID, want); err != nil {
		return nil, InterpretError(err)
	}
	rows, err := tx.Query(ctx, `UPDATE `+s.Statements.leases+` SET
    epoch = CASE WHEN owner IS DISTINCT FROM $1 THEN epoch + 1 ELSE epoch END,
    acquired_at = CASE WHEN owner IS DISTINCT FROM $1 THEN now() ELSE acquired_at END,
    owner = $1, lease_until = now() + $3::interval
WHERE partition = ANY($2::smallint[]) AND (owner = $1 OR owner IS NULL OR lease_until < now())
RETURNING partition, epoch`, p.RelayID, want, interval(p.TTL))
	if err != nil {
		return nil, InterpretError(err)
	}
	var out []outboxdriver.Lease
	for rows.Next() {
		var l outboxdriver.Lease
		var part int16
		if err := rows.Scan(&part, &l.Epoch); err != nil {
			rows.Close()
			return nil, InterpretError(err)
		}
		l.Partition = int(part)
		out = append(out, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, InterpretError(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, InterpretError(err)
	}
	slices.SortFunc(out, func(a, b outboxdriver.Lease) int { return a.Partition - b.Partition })
	return out, nil
}

// Barrier implements outboxdriver.GroupStore: it locks every unpublished row of the
// partitions, waiting behind any claim still holding some, then lets them go.
func (s *Store) Barrier(ctx context.Context, partitions []int) error {
	if len(partitions) == 0 {
		return nil
	}
	parts := make([]int16, len(partitions))
	for i, p := range partitions {
		parts[i] = int16(p)
	}
	tx, err := s.DB.Begin(ctx)
	if err != nil {
		return InterpretError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := boundTx(ctx, tx, "lock_timeout"); err != nil {
		return InterpretError(err)
	}
	var n int64
	err = QueryRow(ctx, tx, `SELECT count(*) FROM (SELECT 1 FROM `+s.Statements.qualified+`
WHERE partition = ANY($1::smallint[]) AND published_at IS NULL FOR UPDATE) AS locked`, []any{parts}, &n)
	if err != nil {
		return fmt.Errorf("partitions %v still locked by a previous owner: %w", partitions, InterpretError(err))
	}
	return nil
}

// boundTx makes the server end tx by ctx's deadline: its statements
// (statement_timeout, and also the setting named by also, such as lock_timeout) and
// the transaction itself when its client goes quiet (a cut-off relay must not hold
// lease or row locks past the bound it works to). Without a deadline it does nothing.
func boundTx(ctx context.Context, tx Querier, also string) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	ms := strconv.FormatInt(max(time.Until(dl).Milliseconds(), 1), 10)
	return tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true),
       CASE WHEN $2 <> '' THEN set_config($2, $1, true) END`, ms, also)
}

// Leave implements outboxdriver.GroupStore.
func (s *Store) Leave(ctx context.Context, relayID string) error {
	if err := s.DB.Exec(ctx, `UPDATE `+s.Statements.leases+` SET owner = NULL, lease_until = '-infinity' WHERE owner = $1`, relayID); err != nil {
		return InterpretError(err)
	}
	return InterpretError(s.DB.Exec(ctx, `DELETE FROM `+s.Statements.relays+` WHERE id = $1`, relayID))
}

// groupStatus fills the relays of a group and the backlog per partition (nothing when
// no relay ever registered).
func (s *Store) groupStatus(ctx context.Context, st *outboxdriver.Status) error {
	rows, err := s.DB.Query(ctx, `SELECT r.id, r.info, extract(epoch FROM now() - r.heartbeat_at)::float8,
       coalesce(array_agg(l.partition ORDER BY l.partition) FILTER (WHERE l.partition IS NOT NULL), '{}')::int[],
       coalesce(extract(epoch FROM now() - min(l.acquired_at)), 0)::float8
FROM `+s.Statements.relays+` AS r LEFT JOIN `+s.Statements.leases+` AS l ON l.owner = r.id AND l.lease_until > now()
GROUP BY r.id, r.info, r.heartbeat_at ORDER BY r.id`)
	if err != nil {
		return InterpretError(err)
	}
	defer rows.Close()
	for rows.Next() {
		var rs outboxdriver.RelayStatus
		var hb, age float64
		var parts []int32
		if err := rows.Scan(&rs.ID, &rs.Info, &hb, &parts, &age); err != nil {
			return InterpretError(err)
		}
		rs.HeartbeatAge, rs.OldestLease = time.Duration(hb*float64(time.Second)), time.Duration(age*float64(time.Second))
		for _, p := range parts {
			rs.Partitions = append(rs.Partitions, int(p))
		}
		st.Relays = append(st.Relays, rs)
	}
	if err := rows.Err(); err != nil || len(st.Relays) == 0 {
		return InterpretError(err)
	}
	rows.Close()
	var n int
	if err := QueryRow(ctx, s.DB, `SELECT count(*) FROM `+s.Statements.leases, nil, &n); err != nil {
		return InterpretError(err)
	}
	st.PartitionBacklog = make([]int64, n)
	brows, err := s.DB.Query(ctx, `SELECT partition, count(*) FROM `+s.Statements.qualified+` WHERE published_at IS NULL GROUP BY partition`)
	if err != nil {
		return InterpretError(err)
	}
	defer brows.Close()
	for brows.Next() {
		var p int16
		var c int64
		if err := brows.Scan(&p, &c); err != nil {
			return InterpretError(err)
		}
		if int(p) < n {
			st.PartitionBacklog[p] = c
		}
	}
	return InterpretError(brows.Err())
}
