package outboxsqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/sqldead"
)

func (d *Driver) deadWhere(f *outboxdriver.DeadFilter) (string, []any) {
	return sqldead.Where(f, func(olderThan time.Duration) any { return d.nowMillis() - olderThan.Milliseconds() })
}

// ListDead implements outboxdriver.Store.
func (d *Driver) ListDead(ctx context.Context, f *outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	where, args := d.deadWhere(f)
	// A preview is cut in the query (substr of a BLOB counts bytes).
	payload, size := "payload", "0"
	if f != nil && f.PayloadMax > 0 {
		payload, size = "substr(payload, 1, "+strconv.Itoa(f.PayloadMax)+")", "length(payload)"
	}
	rows, err := d.db.QueryContext(ctx, `SELECT seq, id, aggregatetype, aggregateid, type, `+payload+`, payload IS NULL, headers,
  tracingspancontext, created_at, attempts, error, dead_at, holds_key, coalesce(`+size+`, 0) FROM `+d.qDead+where, args...)
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
			&trace, &created, &dl.Attempts, &dl.Error, &deadAt, &dl.HoldsKey, &dl.PayloadSize); err != nil {
			return nil, interpretError(err)
		}
		dl.PayloadNull = null
		if dl.PayloadSize <= len(dl.Payload) {
			dl.PayloadSize = 0 // whole
		}
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
	where, args := d.deadWhere(f)
	n, err := sqldead.Move(ctx, d.db, d.q, d.qDead, where, args, replay, "")
	return n, interpretError(err)
}

// EditDead implements outboxdriver.Admin.
func (d *Driver) EditDead(ctx context.Context, id string, e *outboxdriver.DeadEdit) error {
	return interpretError(sqldead.Edit(ctx, d.db, d.qDead, id, e))
}

// RetryNow implements outboxdriver.Admin.
func (d *Driver) RetryNow(ctx context.Context, f *outboxdriver.WaitFilter) (int, error) {
	var where string
	now := d.nowMillis()
	args := []any{now, now}
	if f != nil {
		if len(f.IDs) > 0 {
			where, args = where+" AND id IN (SELECT value FROM json_each(?))", append(args, jsonIDs(f.IDs))
		}
		if f.AggregateType != "" {
			where, args = where+" AND aggregatetype = ?", append(args, f.AggregateType)
		}
		if f.AggregateID != "" {
			where, args = where+" AND aggregateid = ?", append(args, f.AggregateID)
		}
	}
	res, err := d.db.ExecContext(ctx, `UPDATE `+d.q+` SET available_at = ?
WHERE published_at IS NULL AND attempts > 0 AND available_at > ?`+where, args...)
	if err != nil {
		return 0, interpretError(err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// Event implements outboxdriver.Admin.
func (d *Driver) Event(ctx context.Context, id string) (*outboxdriver.EventInfo, error) {
	const common = `seq, id, aggregatetype, aggregateid, type, payload, payload IS NULL, headers, tracingspancontext, created_at, attempts`
	rows, err := d.db.QueryContext(ctx, `SELECT `+common+`, coalesce(last_error, ''), available_at, published_at, NULL, 0, 'outbox'
FROM `+d.q+` WHERE id = ?
UNION ALL SELECT `+common+`, error, NULL, NULL, dead_at, holds_key, 'dead' FROM `+d.qDead+` WHERE id = ?
LIMIT 1`, id, id)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, interpretError(err)
		}
		return nil, fmt.Errorf("%w: %s", outboxdriver.ErrEventNotFound, id)
	}
	var (
		e                            outboxdriver.EventInfo
		null                         bool
		headers, trace               sql.NullString
		created                      int64
		available, published, deadAt sql.NullInt64
		where                        string
	)
	if err := rows.Scan(&e.Seq, &e.ID, &e.AggregateType, &e.AggregateID, &e.Type, &e.Payload, &null, &headers, &trace,
		&created, &e.Attempts, &e.Error, &available, &published, &deadAt, &e.HoldsKey, &where); err != nil {
		return nil, interpretError(err)
	}
	e.PayloadNull = null
	if headers.Valid {
		_ = json.Unmarshal([]byte(headers.String), &e.Headers)
	}
	e.TraceContext = trace.String
	e.CreatedAt = time.UnixMilli(created)
	switch {
	case where == "dead":
		e.State, e.DeadAt = outboxdriver.EventDead, time.UnixMilli(deadAt.Int64)
	case published.Valid:
		e.State, e.PublishedAt = outboxdriver.EventPublished, time.UnixMilli(published.Int64)
	default:
		e.State = outboxdriver.EventWaiting
		if available.Int64 > created {
			e.AvailableAt = time.UnixMilli(available.Int64)
		}
	}
	return &e, interpretError(rows.Err())
}
