// Package sqlstore is what the database/sql drivers with "?" placeholders
// (MySQL/MariaDB, SQLite) share, written once over a small Dialect: the write path
// (inserting events, writing a claim's outcomes, completing published rows), the
// status, an event's story, and the dead letters' filter, replay, purge and edit.
// What differs between the databases (claims and their locks, leadership,
// migrations, cleanup) stays in each driver.
package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxd/outbox/internal/simbug"
	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
)

// Dialect is how a database says what the shared statements need.
type Dialect struct {
	// Now is the current time as SQL, with its arguments: the server's clock
	// (MySQL's UTC_TIMESTAMP(6)) or the driver's, as an argument (SQLite).
	Now func() (string, []any)
	// Clock is the time a dead letter's age is counted from (DeadFilter.OlderThan).
	Clock func() time.Time
	// Time encodes a time as the database stores it.
	Time func(time.Time) any
	// Column reads a time column (or expression) in the form NewTime scans.
	Column func(expr string) string
	// NewTime returns a scanner of one Column value.
	NewTime func() TimeValue
	// IDs is an id list for "id IN ...", with its arguments.
	IDs func(ids []string) (string, []any)
	// ForUpdate locks the rows a query selects, where the database can ("" where
	// it locks the whole database for a write anyway).
	ForUpdate string
	// InsertChunk bounds the rows of one INSERT (bound-variable limits).
	InsertChunk int
	// CreatedAt is the SQL an INSERT writes to created_at ("": the column's default).
	CreatedAt string
	// DueNow is available_at for an event due at once.
	DueNow any
	// Interpret translates the database's errors to outboxdriver's sentinels.
	Interpret func(error) error
}

// TimeValue scans one Column value.
type TimeValue interface {
	sql.Scanner
	// Time is the value, and false for NULL.
	Time() (time.Time, bool)
}

// Placeholders returns "?,?,...", n of them.
func Placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }

// Args converts strings to statement arguments.
func Args(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Base is a driver's table on a database: embedded in the driver (through an alias,
// so that the field stays unexported), it implements what is written the same for
// every dialect: outboxdriver.Driver but its Name (Table, Err, UnwrapExecutor,
// GetExecutor, Store, Migrator), and of the store CompletePublished, Event,
// RetryNow, ReplayDead, PurgeDead and EditDead.
type Base struct {
	db       *sql.DB
	table    outboxdriver.Table
	err      error
	q, qDead string
	d        Dialect
	parts    Parts
}

// Parts are the driver's own: its store (the driver itself), its migrator, and how
// its writers wake a relay up.
type Parts struct {
	Store    outboxdriver.Store
	Migrator outboxdriver.Migrator
	// Notify wakes the relays of this process up after a write commits (nil: they
	// poll).
	Notify func()
}

// NewBase returns the Base of table (quoted q, its dead letters qDead) on db; err is
// the table's validation error, returned by Err.
func NewBase(db *sql.DB, table outboxdriver.Table, err error, q, qDead string, d Dialect, p Parts) Base {
	return Base{db: db, table: table, err: err, q: q, qDead: qDead, d: d, parts: p}
}

// Unpublished fails with outboxdriver.ErrNotCompleted when rows of ids are still
// unpublished after a settle: its SKIP LOCKED passed rows another session held,
// which the caller must not count as completed.
func Unpublished(ctx context.Context, b *Base, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	var n int
	if err := b.db.QueryRowContext(ctx, `SELECT count(*) FROM `+b.q+` WHERE published_at IS NULL AND id IN (`+Placeholders(len(ids))+`)`,
		Args(ids)...).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%w: %d of %d (another session held them when the claim's transaction had ended)", outboxdriver.ErrNotCompleted, n, len(ids))
	}
	return nil
}

// Table implements outboxdriver.Driver.
func (b *Base) Table() outboxdriver.Table { return b.table }

// Err implements outboxdriver.Driver.
func (b *Base) Err() error { return b.err }

// usable is nil when the driver can reach its table: its table is valid and it has a
// database (a writer that only uses WriteTx may have none).
func (b *Base) usable() error {
	if b.err != nil {
		return b.err
	}
	if b.db == nil {
		return outboxdriver.ErrNoPool
	}
	return nil
}

// UnwrapExecutor implements outboxdriver.Driver.
func (b *Base) UnwrapExecutor(tx *sql.Tx) outboxdriver.Executor { return executor{b, tx} }

// GetExecutor implements outboxdriver.Driver.
func (b *Base) GetExecutor() (outboxdriver.Executor, error) {
	if err := b.usable(); err != nil {
		return nil, err
	}
	return executor{b, b.db}, nil
}

// Store implements outboxdriver.Driver.
func (b *Base) Store() (outboxdriver.Store, error) {
	if err := b.usable(); err != nil {
		return nil, err
	}
	return b.parts.Store, nil
}

// Migrator implements outboxdriver.Driver.
func (b *Base) Migrator() (outboxdriver.Migrator, error) {
	if b.err != nil {
		return nil, b.err
	}
	return b.parts.Migrator, nil
}

// Execer runs statements: a *sql.DB or a *sql.Tx.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// executor writes events through q (the caller's transaction, or the database).
type executor struct {
	b *Base
	q Execer
}

func (e executor) InsertEvents(ctx context.Context, p *outboxdriver.InsertParams) error {
	return InsertEvents(ctx, e.b, e.q, p)
}

func (e executor) Notify(context.Context) error {
	if e.b.parts.Notify != nil {
		e.b.parts.Notify()
	}
	return nil
}

// InsertEvents inserts p's events through q, in statements of at most InsertChunk
// rows.
func InsertEvents(ctx context.Context, b *Base, q Execer, p *outboxdriver.InsertParams) error {
	cols, row := "", "(?,?,?,?,?,?,?,?)"
	if b.d.CreatedAt != "" {
		cols, row = ", created_at", "(?,?,?,?,?,?,?,?,"+b.d.CreatedAt+")"
	}
	for start := 0; start < len(p.Events); start += b.d.InsertChunk {
		evs := p.Events[start:min(start+b.d.InsertChunk, len(p.Events))]
		var s strings.Builder
		s.WriteString("INSERT INTO " + b.q + " (id, aggregatetype, aggregateid, type, payload, headers, available_at, tracingspancontext" + cols + ") VALUES ")
		args := make([]any, 0, len(evs)*8)
		for i, ev := range evs {
			if i > 0 {
				s.WriteByte(',')
			}
			s.WriteString(row)
			avail := b.d.DueNow
			if !ev.AvailableAt.IsZero() {
				avail = b.d.Time(ev.AvailableAt)
			}
			payload := ev.Payload
			if payload == nil {
				payload = []byte{}
			}
			var headers, trace any
			if ev.Headers != nil {
				headers = string(ev.Headers)
			}
			if ev.TraceContext != "" {
				trace = ev.TraceContext
			}
			args = append(args, ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, payload, headers, avail, trace)
		}
		if _, err := q.ExecContext(ctx, s.String(), args...); err != nil {
			return b.d.Interpret(err)
		}
	}
	return nil
}

// completePublished is the statement that marks (or deletes) published rows.
func completePublished(b *Base, ids []string, c outboxdriver.Completion) (string, []any) {
	in, args := b.d.IDs(ids)
	if c == outboxdriver.CompleteDelete {
		return `DELETE FROM ` + b.q + ` WHERE id IN ` + in, args
	}
	now, nowArgs := b.d.Now()
	return `UPDATE ` + b.q + ` SET published_at = ` + now + `, last_error = NULL WHERE id IN ` + in, append(nowArgs, args...)
}

// CompletePublished implements outboxdriver.Completer: a claim's statement for
// published rows, outside any claim (a transactional publisher's resume).
func (b *Base) CompletePublished(ctx context.Context, ids []string, c outboxdriver.Completion) error {
	if len(ids) == 0 {
		return nil
	}
	stmt, args := completePublished(b, ids, c)
	_, err := b.db.ExecContext(ctx, stmt, args...)
	return b.d.Interpret(err)
}

// WriteOutcomes writes a claim's outcomes in tx: marks (or deletes) the published
// rows, moves the dead ones to the dead letters, and records the failures' attempts
// and retry times.
func WriteOutcomes(ctx context.Context, b *Base, tx *sql.Tx, p *outboxdriver.CompleteParams) error {
	if len(p.Published) > 0 {
		stmt, args := completePublished(b, p.Published, p.Completion)
		if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
			return err
		}
	}
	for _, f := range p.Failed {
		n := 0
		if f.CountAttempt {
			n = 1
		}
		now, nowArgs := b.d.Now()
		if f.Dead && simbug.On("dead-marked-published") {
			if _, err := tx.ExecContext(ctx, `UPDATE `+b.q+` SET published_at = `+now+` WHERE id = ?`, append(nowArgs, f.ID)...); err != nil {
				return err
			}
			continue
		}
		if f.Dead {
			args := append(append([]any{n, f.Error}, nowArgs...), f.HoldKey, f.ID)
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+b.qDead+` (id, aggregatetype, aggregateid, type, payload, headers,
  tracingspancontext, seq, created_at, attempts, error, dead_at, holds_key)
SELECT id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, seq, created_at, attempts + ?, ?, `+now+`, ?
FROM `+b.q+` WHERE id = ?`, args...); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+b.q+` WHERE id = ?`, f.ID); err != nil {
				return err
			}
			continue
		}
		var retry any
		if !f.RetryAt.IsZero() {
			retry = b.d.Time(f.RetryAt)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+b.q+` SET attempts = attempts + ?, last_error = ?,
  available_at = COALESCE(?, available_at) WHERE id = ?`, n, f.Error, retry, f.ID); err != nil {
			return err
		}
	}
	return nil
}

// Status reads the table's counts and the age of its oldest unpublished event (the
// driver adds who leads).
func Status(ctx context.Context, b *Base) (*outboxdriver.Status, error) {
	st := &outboxdriver.Status{Table: b.table.Name}
	now, args := b.d.Now()
	oldest, at := b.d.NewTime(), b.d.NewTime()
	err := b.db.QueryRowContext(ctx, `SELECT
  COALESCE(SUM(CASE WHEN published_at IS NULL THEN 1 ELSE 0 END), 0),
  `+b.d.Column(`MIN(CASE WHEN published_at IS NULL THEN created_at END)`)+`,
  `+b.d.Column(now)+`,
  COALESCE(SUM(CASE WHEN published_at IS NOT NULL THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN published_at IS NULL AND attempts > 0 THEN 1 ELSE 0 END), 0),
  (SELECT COUNT(*) FROM `+b.qDead+`),
  (SELECT COUNT(*) FROM (SELECT DISTINCT aggregatetype, aggregateid FROM `+b.qDead+` WHERE holds_key) AS h)
FROM `+b.q, args...).Scan(&st.Unpublished, oldest, at, &st.Published, &st.Failing, &st.Dead, &st.HeldKeys)
	if err != nil {
		return nil, b.d.Interpret(err)
	}
	if o, ok := oldest.Time(); ok {
		n, _ := at.Time()
		st.OldestAge = max(n.Sub(o), time.Microsecond)
	}
	return st, nil
}

// RowColumns are the columns ScanRow reads, with the table's times as Column reads them.
func RowColumns(d Dialect) string {
	return `seq, id, aggregatetype, aggregateid, type, payload, payload IS NULL, headers, tracingspancontext, ` +
		d.Column("created_at") + `, attempts`
}

// ScanRow scans RowColumns, then extra.
func ScanRow(rows *sql.Rows, d Dialect, extra ...any) (outboxdriver.Row, error) {
	var (
		r              outboxdriver.Row
		null           bool
		headers, trace sql.NullString
		created        = d.NewTime()
	)
	dest := append([]any{&r.Seq, &r.ID, &r.AggregateType, &r.AggregateID, &r.Type, &r.Payload, &null, &headers, &trace, created, &r.Attempts}, extra...)
	if err := rows.Scan(dest...); err != nil {
		return r, err
	}
	r.PayloadNull = null
	if null {
		r.Payload = nil
	} else if r.Payload == nil {
		r.Payload = []byte{}
	}
	if headers.Valid {
		r.Headers = outboxdriver.ParseHeaders([]byte(headers.String))
	}
	r.TraceContext = trace.String
	r.CreatedAt, _ = created.Time()
	return r, nil
}

// Event implements outboxdriver.Admin.
func (b *Base) Event(ctx context.Context, id string) (*outboxdriver.EventInfo, error) {
	cols, d := RowColumns(b.d), b.d
	rows, err := b.db.QueryContext(ctx, `SELECT `+cols+`, COALESCE(last_error, ''), `+d.Column("available_at")+`,
  `+d.Column("published_at")+`, NULL, 0, 'outbox' FROM `+b.q+` WHERE id = ?
UNION ALL SELECT `+cols+`, error, NULL, NULL, `+d.Column("dead_at")+`, holds_key, 'dead' FROM `+b.qDead+` WHERE id = ?
LIMIT 1`, id, id)
	if err != nil {
		return nil, d.Interpret(err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, d.Interpret(err)
		}
		return nil, fmt.Errorf("%w: %s", outboxdriver.ErrEventNotFound, id)
	}
	var (
		e                            outboxdriver.EventInfo
		available, published, deadAt = d.NewTime(), d.NewTime(), d.NewTime()
		where                        string
	)
	if e.Row, err = ScanRow(rows, d, &e.Error, available, published, deadAt, &e.HoldsKey, &where); err != nil {
		return nil, d.Interpret(err)
	}
	switch {
	case where == "dead":
		e.State = outboxdriver.EventDead
		e.DeadAt, _ = deadAt.Time()
	case isSet(published):
		e.State = outboxdriver.EventPublished
		e.PublishedAt, _ = published.Time()
	default:
		e.State = outboxdriver.EventWaiting
		if t, ok := available.Time(); ok && t.After(e.CreatedAt) {
			e.AvailableAt = t
		}
	}
	return &e, d.Interpret(rows.Err())
}

func isSet(v TimeValue) bool {
	_, ok := v.Time()
	return ok
}

// RetryNow implements outboxdriver.Admin.
func (b *Base) RetryNow(ctx context.Context, f *outboxdriver.WaitFilter) (int, error) {
	now, args := b.d.Now()
	args = append(args, args...) // twice: the SET and the WHERE
	var where string
	if f != nil {
		if len(f.IDs) > 0 {
			in, idArgs := b.d.IDs(f.IDs)
			where, args = where+" AND id IN "+in, append(args, idArgs...)
		}
		if f.AggregateType != "" {
			where, args = where+" AND aggregatetype = ?", append(args, f.AggregateType)
		}
		if f.AggregateID != "" {
			where, args = where+" AND aggregateid = ?", append(args, f.AggregateID)
		}
	}
	res, err := b.db.ExecContext(ctx, `UPDATE `+b.q+` SET available_at = `+now+`
WHERE published_at IS NULL AND attempts > 0 AND available_at > `+now+where, args...)
	if err != nil {
		return 0, b.d.Interpret(err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// DeadWhere is f as a WHERE clause on the dead letters, with its arguments.
func DeadWhere(b *Base, f *outboxdriver.DeadFilter) (string, []any) {
	return Where(f, func(olderThan time.Duration) any { return b.d.Time(b.d.Clock().Add(-olderThan)) })
}

// ReplayDead implements outboxdriver.Admin: the rows go back with their original seq.
func (b *Base) ReplayDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	return b.moveDead(ctx, f, true)
}

// PurgeDead implements outboxdriver.Admin.
func (b *Base) PurgeDead(ctx context.Context, f *outboxdriver.DeadFilter) (int, error) {
	return b.moveDead(ctx, f, false)
}

func (b *Base) moveDead(ctx context.Context, f *outboxdriver.DeadFilter, replay bool) (int, error) {
	where, args := DeadWhere(b, f)
	n, err := Move(ctx, b.db, b.q, b.qDead, where, args, replay, b.d.ForUpdate)
	return n, b.d.Interpret(err)
}

// EditDead implements outboxdriver.Admin.
func (b *Base) EditDead(ctx context.Context, id string, e *outboxdriver.DeadEdit) error {
	return b.d.Interpret(Edit(ctx, b.db, b.qDead, id, e))
}

// FindTables returns the outbox tables (those `outbox migrate` made: their
// migrations table beside them, named by migrations) among the schema and name pairs
// list selects, that match any of patterns. A pattern's default schema
// (outboxdriver.DefaultSchema) stands for def.
func FindTables(ctx context.Context, db *sql.DB, list, def string, migrations func(outboxdriver.Table) string, patterns []outboxdriver.TablePattern) ([]outboxdriver.Table, error) {
	patterns = slices.Clone(patterns)
	for i, p := range patterns {
		if p.Schema == outboxdriver.DefaultSchema {
			patterns[i].Schema = def
		}
	}
	rows, err := db.QueryContext(ctx, list)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	all, err := sqlrules.ScanTables(rows)
	if err != nil {
		return nil, err
	}
	return sqlrules.OutboxTables(all, migrations, patterns), nil
}
