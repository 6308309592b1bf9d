package pgsql

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// deadWhere renders a DeadFilter as a WHERE clause with its arguments.
func deadWhere(f *outboxdriver.DeadFilter) (string, []any) {
	if f == nil {
		f = &outboxdriver.DeadFilter{}
	}
	// An id that is not a UUID names no dead letter: it is dropped here, not sent
	// for the database to refuse the whole statement (SQLSTATE 22P02).
	ids := make([]string, 0, len(f.IDs))
	for _, id := range f.IDs {
		if _, err := uuid.Parse(id); err == nil {
			ids = append(ids, id)
		}
	}
	where := ` WHERE (cardinality($1::uuid[]) = 0 OR id = ANY($1::uuid[]))
  AND ($2 = '' OR aggregatetype = $2) AND ($3 = '' OR aggregateid = $3) AND ($4 = '' OR type = $4)
  AND dead_at <= now() - make_interval(secs => $5::float8)`
	if len(f.IDs) > 0 && len(ids) == 0 {
		where += " AND false"
	}
	args := []any{ids, f.AggregateType, f.AggregateID, f.Type, f.OlderThan.Seconds()}
	return where, args
}

func limit(f *outboxdriver.DeadFilter) string {
	if f == nil || f.Limit <= 0 {
		return ""
	}
	return " LIMIT " + strconv.Itoa(f.Limit)
}

// ListDead implements outboxdriver.Store.
func (s *Store) ListDead(ctx context.Context, f *outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	where, args := deadWhere(f)
	// A preview is cut in the query: a 100 MB payload never leaves the database whole.
	payloadCol, size := "payload", "0"
	if f != nil && f.PayloadMax > 0 {
		payloadCol, size = "left(payload::text, $6)", "octet_length(payload::text)"
		if s.Statements.table.Payload == outboxdriver.PayloadBytes {
			payloadCol, size = "substring(payload from 1 for $6)", "octet_length(payload)"
		}
		args = append(args, f.PayloadMax)
	}
	rows, err := s.DB.Query(ctx, `SELECT seq, id::text, aggregatetype, aggregateid, type, `+payloadCol+`, headers::text,
       tracingspancontext, created_at, attempts, error, dead_at, holds_key, coalesce(`+size+`, 0)
FROM `+s.Statements.dead+where+` ORDER BY dead_at, seq`+limit(f), args...)
	if err != nil {
		return nil, InterpretError(err)
	}
	defer rows.Close()
	var out []outboxdriver.DeadLetter
	for rows.Next() {
		var (
			d              outboxdriver.DeadLetter
			payload        []byte
			headers, trace *string
		)
		if err := rows.Scan(&d.Seq, &d.ID, &d.AggregateType, &d.AggregateID, &d.Type, &payload, &headers, &trace,
			&d.CreatedAt, &d.Attempts, &d.Error, &d.DeadAt, &d.HoldsKey, &d.PayloadSize); err != nil {
			return nil, InterpretError(err)
		}
		d.Payload, d.PayloadNull = payload, payload == nil
		if d.PayloadSize <= len(d.Payload) {
			d.PayloadSize = 0 // whole
		}
		if headers != nil {
			_ = json.Unmarshal([]byte(*headers), &d.Headers)
		}
		if trace != nil {
			d.TraceContext = *trace
		}
		out = append(out, d)
	}
	return out, InterpretError(rows.Err())
}

// behindSQL is a CTE, "behind", of the dead letters waiting behind a holding dead
// letter of "sel" (outboxdriver.WaitingBehindDeadLetter, the CDC source's): they did
// not fail, and go back to the outbox when the one they wait behind is replayed or
// purged. $6 is the waiting error.
func (s *Statements) behindSQL() string {
	return `behind AS (SELECT w.id FROM ` + s.dead + ` AS w JOIN sel AS h ON h.holds_key
    AND w.aggregatetype = h.aggregatetype AND w.aggregateid = h.aggregateid AND w.seq > h.seq
  WHERE NOT w.holds_key AND w.error = $6)`
}

// backToOutbox is the CTEs "moved" and "ins" moving the dead letters whose ids the CTE
// named from lists back into the outbox, with their original seq (OVERRIDING SYSTEM
// VALUE), so they precede the later events of their aggregate. They are due at once
// (available_at = their write time, never the replay's now(): a claim that began
// before the replay committed would otherwise see the aggregate released but the
// replayed event not yet due, and send the next event first). A dead letter that held
// nothing back ($6 is the waiting-behind reason) goes back marked late: its
// aggregate's later events went on past it, so its outbox-seq is no version.
func (s *Statements) backToOutbox(from string) string {
	return `moved AS (DELETE FROM ` + s.dead + ` AS d USING ` + from + ` WHERE d.id = ` + from + `.id
          RETURNING d.id, d.aggregatetype, d.aggregateid, d.type, d.payload,
                    CASE WHEN NOT d.holds_key AND d.error <> $6 THEN coalesce(d.headers, '{}'::jsonb) || jsonb_build_object('` + wire.HeaderLate + `', '` + wire.LateReplayed + `')
                         ELSE d.headers END,
                    d.tracingspancontext, d.seq, d.created_at),
ins AS (INSERT INTO ` + s.qualified + ` (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, seq, created_at, available_at)
        OVERRIDING SYSTEM VALUE SELECT *, moved.created_at FROM moved ORDER BY seq RETURNING 1)`
}

// ReplayDead implements outboxdriver.Store: one statement moves the selected rows,
// and those waiting behind them, back into the outbox.
func (s *Store) ReplayDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	where, args := deadWhere(f)
	var n int
	err := QueryRow(ctx, s.DB, `WITH sel AS (SELECT id, aggregatetype, aggregateid, seq, holds_key FROM `+s.Statements.dead+where+` ORDER BY seq`+limit(f)+`),
`+s.Statements.behindSQL()+`,
picked AS (SELECT id FROM sel UNION SELECT id FROM behind),
`+s.Statements.backToOutbox("picked")+`
SELECT count(*) FROM ins`, append(args, outboxdriver.WaitingBehindDeadLetter), &n)
	return n, InterpretError(err)
}

// PurgeDead implements outboxdriver.Store: the selected rows are deleted, and those
// waiting behind them go back to the outbox, in the same statement (selected or not:
// they did not fail, as in poll mode, where they wait in the table).
func (s *Store) PurgeDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	where, args := deadWhere(f)
	var n int
	err := QueryRow(ctx, s.DB, `WITH sel AS (SELECT id, aggregatetype, aggregateid, seq, holds_key FROM `+s.Statements.dead+where+` ORDER BY seq`+limit(f)+`),
`+s.Statements.behindSQL()+`,
del AS (DELETE FROM `+s.Statements.dead+` AS d USING sel WHERE d.id = sel.id AND d.id NOT IN (SELECT id FROM behind) RETURNING 1),
`+s.Statements.backToOutbox("behind")+`
SELECT count(*) FROM del`, append(args, outboxdriver.WaitingBehindDeadLetter), &n)
	return n, InterpretError(err)
}

// EditDead implements outboxdriver.Admin. The payload parameter takes the column's
// own type (jsonb checks it is JSON).
func (s *Store) EditDead(ctx context.Context, id string, e *outboxdriver.DeadEdit) error {
	if _, err := uuid.Parse(id); err != nil {
		return fmt.Errorf("%w: %q is not a UUID", outboxdriver.ErrEventNotFound, id)
	}
	headers, err := e.HeadersJSON()
	if err != nil {
		return err
	}
	var payload any
	if e.Payload != nil {
		payload = string(e.Payload)
		if s.Statements.table.Payload == outboxdriver.PayloadBytes {
			payload = e.Payload
		}
	}
	var n int
	err = QueryRow(ctx, s.DB, `WITH ed AS (UPDATE `+s.Statements.dead+` SET
    payload = CASE WHEN $2 THEN $3 ELSE payload END,
    headers = CASE WHEN $4::text IS NULL THEN headers ELSE $4::text::jsonb END
  WHERE id = $1::uuid RETURNING 1)
SELECT count(*) FROM ed`, []any{id, e.Payload != nil, payload, nullString(headers)}, &n)
	if err != nil {
		return InterpretError(err)
	}
	if n == 0 {
		return fmt.Errorf("%w: no dead letter %s", outboxdriver.ErrEventNotFound, id)
	}
	return nil
}

func nullString(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}

// RetryNow implements outboxdriver.Admin.
func (s *Store) RetryNow(ctx context.Context, f *outboxdriver.WaitFilter) (int, error) {
	if f == nil {
		f = &outboxdriver.WaitFilter{}
	}
	ids := f.IDs
	if ids == nil {
		ids = []string{}
	}
	var n int
	err := QueryRow(ctx, s.DB, `WITH due AS (UPDATE `+s.Statements.qualified+` SET available_at = now()
  WHERE published_at IS NULL AND attempts > 0 AND available_at > now()
    AND (cardinality($1::uuid[]) = 0 OR id = ANY($1::uuid[])) AND ($2 = '' OR aggregatetype = $2) AND ($3 = '' OR aggregateid = $3)
  RETURNING 1)
SELECT count(*) FROM due`, []any{ids, f.AggregateType, f.AggregateID}, &n)
	return n, InterpretError(err)
}

// Event implements outboxdriver.Admin: one statement looks in the outbox, the
// archive and the dead letters (an id lives in one of them at a time).
func (s *Store) Event(ctx context.Context, id string) (*outboxdriver.EventInfo, error) {
	if _, err := uuid.Parse(id); err != nil {
		return nil, fmt.Errorf("%w: %q is not a UUID", outboxdriver.ErrEventNotFound, id)
	}
	const common = `seq, id::text, aggregatetype, aggregateid, type, payload, headers::text, tracingspancontext, created_at, attempts`
	rows, err := s.DB.Query(ctx, `SELECT 'outbox', `+common+`, coalesce(last_error, ''), available_at, published_at, NULL::timestamptz, false
FROM `+s.Statements.qualified+` WHERE id = $1
UNION ALL SELECT 'archive', `+common+`, '', NULL, published_at, NULL, false FROM `+s.Statements.published+` WHERE id = $1
UNION ALL SELECT 'dead', `+common+`, error, NULL, NULL, dead_at, holds_key FROM `+s.Statements.dead+` WHERE id = $1
LIMIT 1`, id)
	if err != nil {
		return nil, InterpretError(err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, InterpretError(err)
		}
		return nil, fmt.Errorf("%w: %s", outboxdriver.ErrEventNotFound, id)
	}
	var (
		e                            outboxdriver.EventInfo
		where                        string
		payload                      []byte
		headers, trace               *string
		available, published, deadAt *time.Time
	)
	if err := rows.Scan(&where, &e.Seq, &e.ID, &e.AggregateType, &e.AggregateID, &e.Type, &payload, &headers, &trace,
		&e.CreatedAt, &e.Attempts, &e.Error, &available, &published, &deadAt, &e.HoldsKey); err != nil {
		return nil, InterpretError(err)
	}
	e.Payload, e.PayloadNull = payload, payload == nil
	if headers != nil {
		e.Headers = outboxdriver.ParseHeaders([]byte(*headers))
	}
	if trace != nil {
		e.TraceContext = *trace
	}
	switch {
	case where == "dead":
		e.State, e.DeadAt = outboxdriver.EventDead, *deadAt
	case published != nil:
		e.State, e.PublishedAt, e.Archived = outboxdriver.EventPublished, *published, where == "archive"
	default:
		e.State = outboxdriver.EventWaiting
		if available != nil && available.After(e.CreatedAt) {
			e.AvailableAt = *available
		}
	}
	return &e, InterpretError(rows.Err())
}
