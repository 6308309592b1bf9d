package outboxsqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
)

func deadWhere(f *outboxdriver.DeadFilter) (string, []any) {
	if f == nil {
		f = &outboxdriver.DeadFilter{}
	}
	var b strings.Builder
	b.WriteString(" WHERE dead_at <= ?")
	args := []any{nowMillis() - f.OlderThan.Milliseconds()}
	if len(f.IDs) > 0 {
		ids, _ := json.Marshal(f.IDs)
		b.WriteString(" AND id IN (SELECT value FROM json_each(?))")
		args = append(args, string(ids))
	}
	for _, c := range []struct{ col, v string }{{"aggregatetype", f.AggregateType}, {"aggregateid", f.AggregateID}, {"type", f.Type}} {
		if c.v != "" {
			b.WriteString(" AND " + c.col + " = ?")
			args = append(args, c.v)
		}
	}
	b.WriteString(" ORDER BY seq")
	if f.Limit > 0 {
		b.WriteString(" LIMIT " + strconv.Itoa(f.Limit))
	}
	return b.String(), args
}

// ListDead implements outboxdriver.Store.
func (d *Driver) ListDead(ctx context.Context, f *outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	where, args := deadWhere(f)
	rows, err := d.db.QueryContext(ctx, `SELECT seq, id, aggregatetype, aggregateid, type, payload, payload IS NULL, headers,
  tracingspancontext, created_at, attempts, error, dead_at, holds_key FROM `+d.qDead+where, args...)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	var out []outboxdriver.DeadLetter
	for rows.Next() {
		var (
			dl              outboxdriver.DeadLetter
			null            bool
			headers, trace  sql.NullString
			created, deadAt int64
		)
		if err := rows.Scan(&dl.Seq, &dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Payload, &null, &headers,
			&trace, &created, &dl.Attempts, &dl.Error, &deadAt, &dl.HoldsKey); err != nil {
			return nil, interpretError(err)
		}
		dl.PayloadNull = null
		if headers.Valid {
			_ = json.Unmarshal([]byte(headers.String), &dl.Headers)
		}
		dl.TraceContext = trace.String
		dl.CreatedAt, dl.DeadAt = time.UnixMilli(created), time.UnixMilli(deadAt)
		out = append(out, dl)
	}
	return out, interpretError(rows.Err())
}

// ReplayDead implements outboxdriver.Store: the rows go back with their original seq.
func (d *Driver) ReplayDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	return d.moveDead(ctx, f, true)
}

// PurgeDead implements outboxdriver.Store.
func (d *Driver) PurgeDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	return d.moveDead(ctx, f, false)
}

func (d *Driver) moveDead(ctx context.Context, f *outboxdriver.DeadFilter, replay bool) (int, error) {
	where, args := deadWhere(f)
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, interpretError(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `CREATE TEMP TABLE IF NOT EXISTS outbox_picked (id TEXT PRIMARY KEY)`); err != nil {
		return 0, interpretError(err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM temp.outbox_picked`); err != nil {
		return 0, interpretError(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO temp.outbox_picked SELECT id FROM `+d.qDead+where, args...); err != nil {
		return 0, interpretError(err)
	}
	if replay {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+d.q+` (seq, id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, created_at)
SELECT seq, id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, created_at FROM `+d.qDead+`
WHERE id IN (SELECT id FROM temp.outbox_picked)`); err != nil {
			return 0, interpretError(err)
		}
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM `+d.qDead+` WHERE id IN (SELECT id FROM temp.outbox_picked)`)
	if err != nil {
		return 0, interpretError(err)
	}
	n, _ := res.RowsAffected()
	return int(n), interpretError(tx.Commit())
}
