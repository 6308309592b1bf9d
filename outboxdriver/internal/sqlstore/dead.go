package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxd/outbox/internal/wire"
	"github.com/outboxd/outbox/outboxdriver"
)

// Where renders f as a WHERE clause (with ORDER BY and LIMIT). cutoff is the
// database's value for "dead at or before now minus f.OlderThan", used only when
// f.OlderThan is set: dead_at was written by another clock (the relay's host, or the
// database server's), and a reader whose clock is behind it must still see a dead
// letter just written.
func Where(f *outboxdriver.DeadFilter, cutoff func(olderThan time.Duration) any) (string, []any) {
	if f == nil {
		f = &outboxdriver.DeadFilter{}
	}
	var b strings.Builder
	b.WriteString(" WHERE true")
	var args []any
	if f.OlderThan > 0 {
		b.WriteString(" AND dead_at <= ?")
		args = append(args, cutoff(f.OlderThan))
	}
	if len(f.IDs) > 0 {
		b.WriteString(" AND id IN (" + Placeholders(len(f.IDs)) + ")")
		args = append(args, Args(f.IDs)...)
	}
	for _, c := range []struct{ col, v string }{{"aggregatetype", f.AggregateType}, {"aggregateid", f.AggregateID}, {"type", f.Type}} {
		if c.v != "" {
			b.WriteString(" AND " + c.col + " = ?")
			args = append(args, c.v)
		}
	}
	b.WriteString(" ORDER BY seq")
	if f.Limit > 0 {
		fmt.Fprintf(&b, " LIMIT %d", f.Limit)
	}
	return b.String(), args
}

// Move moves the dead letters matching where out of the dead table, back into the
// outbox with their original seq when replay, in one transaction. lock is appended to
// the selecting query (" FOR UPDATE" where the database has it).
func Move(ctx context.Context, db *sql.DB, outbox, dead, where string, args []any, replay bool, lock string) (int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, `SELECT id FROM `+dead+where+lock, args...)
	if err != nil {
		return 0, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	in := " WHERE id IN (" + Placeholders(len(ids)) + ")"
	if replay {
		// A dead letter that held nothing back (its aggregate's later events went on
		// past it) goes back marked late: its outbox-seq is no version to compare.
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+outbox+` (seq, id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, created_at)
SELECT seq, id, aggregatetype, aggregateid, type, payload,
       CASE WHEN NOT holds_key AND error <> ? THEN JSON_SET(COALESCE(headers, '{}'), '$."`+wire.HeaderLate+`"', '`+wire.LateReplayed+`') ELSE headers END,
       tracingspancontext, created_at FROM `+dead+in, append([]any{outboxdriver.WaitingBehindDeadLetter}, Args(ids)...)...); err != nil {
			return 0, err
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM `+dead+in, Args(ids)...); err != nil {
		return 0, err
	}
	return len(ids), tx.Commit()
}

// Edit changes a dead letter's payload or headers (nil: left as it is), with "?"
// placeholders; ErrEventNotFound when no dead letter has that id.
func Edit(ctx context.Context, db *sql.DB, dead, id string, e *outboxdriver.DeadEdit) error {
	headers, err := e.HeadersJSON()
	if err != nil {
		return err
	}
	var set []string
	var args []any
	if e.Payload != nil {
		set, args = append(set, "payload = ?"), append(args, e.Payload)
	}
	if headers != nil {
		set, args = append(set, "headers = ?"), append(args, string(headers))
	}
	var n int64
	if len(set) > 0 {
		res, err := db.ExecContext(ctx, "UPDATE "+dead+" SET "+strings.Join(set, ", ")+" WHERE id = ?", append(args, id)...)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
	}
	if n == 0 {
		// MySQL counts changed rows only: tell "unchanged" from "not there".
		var one int
		if err := db.QueryRowContext(ctx, "SELECT 1 FROM "+dead+" WHERE id = ?", id).Scan(&one); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("%w: no dead letter %s", outboxdriver.ErrEventNotFound, id)
			}
			return err
		}
	}
	return nil
}
