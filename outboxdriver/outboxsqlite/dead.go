package outboxsqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"time"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/sqlstore"
)

// ListDead implements outboxdriver.Store.
func (d *Driver) ListDead(ctx context.Context, f *outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	where, args := sqlstore.DeadWhere(&d.base, f)
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
