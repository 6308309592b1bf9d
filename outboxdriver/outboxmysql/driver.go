// Package outboxmysql is the outbox driver for MySQL 8 and MariaDB 10.6+ through
// database/sql and github.com/go-sql-driver/mysql.
//
//	db, _ := sql.Open("mysql", "app@tcp(db:3306)/app")
//	w, _ := outbox.NewWriter(outboxmysql.New(db, nil), nil)
//	tx, _ := db.BeginTx(ctx, nil)
//	w.WriteTx(ctx, tx, event) // in the same transaction as the business change
//
// Claims use FOR UPDATE SKIP LOCKED in READ COMMITTED transactions, so they take no gap
// locks that would block producers' inserts. Leadership is a GET_LOCK held by a
// dedicated session. All times are UTC (UTC_TIMESTAMP), whatever the session's zone.
package outboxmysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/migrations"
	"github.com/outboxd/outbox/outboxdriver/internal/sqlstore"
	"github.com/outboxd/outbox/outboxdriver/internal/sqltx"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Driver binds outbox to a MySQL/MariaDB *sql.DB. Build it with New. It is an
// outboxdriver.Driver[*sql.Tx] (Table, Err, GetExecutor, UnwrapExecutor, Store and
// Migrator, written once for MySQL and SQLite, are not listed below), and its Store
// is the Driver itself: an outboxdriver.Store, Admin (with Event, RetryNow,
// ReplayDead, PurgeDead and EditDead) and Completer (CompletePublished).
type Driver struct {
	base  // the methods written once for MySQL and SQLite
	db    *sql.DB
	table outboxdriver.Table
	q     string // `table`
	qDead string
	lock  string // GET_LOCK name
	// versions is the migrations table; its first row is the claim fence (MySQL has
	// no shared advisory lock): claims share-lock it, a new leader waits to lock it.
	versions string
}

// New returns a driver on db (nil is allowed for a writer that only uses WriteTx).
// The table's Schema, if set, is the database name.
func New(db *sql.DB, table *outboxdriver.Table) *Driver {
	var t outboxdriver.Table
	if table != nil {
		t = *table
	}
	if t.Schema == "" {
		t.Schema = "_current"
	}
	t = t.WithDefaults()
	d := &Driver{db: db, table: t}
	prefix := ""
	if t.Schema != "_current" && t.Schema != outboxdriver.DefaultSchema {
		prefix = quote(t.Schema) + "."
	}
	d.q, d.qDead = prefix+quote(t.Name), prefix+quote(t.Derived("_dead"))
	d.versions = prefix + quote(t.Name+"_migrations")
	sum := sha256.Sum256([]byte("outbox relay " + t.String()))
	d.lock = "outbox:" + hex.EncodeToString(sum[:16])
	d.base = sqlstore.NewBase(db, t, t.ValidatePortable(), d.q, d.qDead, dialect, sqlstore.Parts{Store: d, Migrator: newMigrator(d)})
	return d
}

func quote(id string) string { return "`" + strings.ReplaceAll(id, "`", "``") + "`" }

// base is the part written once for MySQL and SQLite (an alias: the field stays
// unexported).
type base = sqlstore.Base

// dialect is MySQL's: times are the server's UTC_TIMESTAMP(6), read back as text.
var dialect = sqlstore.Dialect{
	Now:   func() (string, []any) { return "UTC_TIMESTAMP(6)", nil },
	Clock: time.Now,
	Time:  func(t time.Time) any { return utc(t) },
	Column: func(expr string) string {
		return "DATE_FORMAT(" + expr + ", '%Y-%m-%d %H:%i:%s.%f')"
	},
	NewTime: func() sqlstore.TimeValue { return &textTime{} },
	IDs: func(ids []string) (string, []any) {
		return "(" + sqlstore.Placeholders(len(ids)) + ")", sqlstore.Args(ids)
	},
	ForUpdate:   " FOR UPDATE",
	InsertChunk: 500,
	CreatedAt:   "UTC_TIMESTAMP(6)",
	Interpret:   interpretError,
}

// textTime is a time column as DATE_FORMAT writes it, in UTC.
type textTime struct{ s sql.NullString }

func (t *textTime) Scan(src any) error { return t.s.Scan(src) }

func (t *textTime) Time() (time.Time, bool) {
	if !t.s.Valid {
		return time.Time{}, false
	}
	v, _ := time.ParseInLocation("2006-01-02 15:04:05.000000", t.s.String, time.UTC)
	return v, true
}

var (
	_ outboxdriver.Driver[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store           = (*Driver)(nil)
)

// Name implements outboxdriver.Driver.
func (d *Driver) Name() string { return "mysql" }

// interpretError translates MySQL errors to the outboxdriver sentinels.
func interpretError(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1054: // unknown column: a table made by hand, or by an older version
			return fmt.Errorf("%w: %s (run `outbox migrate`)", outboxdriver.ErrSchemaBehind, me.Message)
		case 1146, 1049: // no such table, unknown database
			return fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, me.Message)
		case 1062:
			return fmt.Errorf("%w: %s", outboxdriver.ErrDuplicateID, me.Message)
		}
	}
	return err
}

const timeFormat = "2006-01-02 15:04:05.999999"

func utc(t time.Time) string { return t.UTC().Format(timeFormat) }

// rowColumns are selected for Row; times come back as UTC text.
var rowColumns = sqlstore.RowColumns(dialect)

func scanRow(rows *sql.Rows, extra ...any) (outboxdriver.Row, error) {
	return sqlstore.ScanRow(rows, dialect, extra...)
}

// Capabilities implements outboxdriver.Source: mark and delete completion only.
func (d *Driver) Capabilities() outboxdriver.Capabilities {
	c := outboxdriver.Basic()
	c.Split = true
	return c
}

// Claim implements outboxdriver.Store.
func (d *Driver) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	if p.MaxSeq > 0 {
		return nil, fmt.Errorf("claim up to a seq: %w", outboxdriver.ErrNotSupported)
	}
	if len(p.Columns) > 0 {
		return nil, fmt.Errorf("claim with extra columns %v: %w", p.Columns, outboxdriver.ErrNotSupported)
	}
	// The claim's transaction outlives this call (database/sql would roll it back
	// when ctx ends): its life is Complete or Release. It runs on a session of its
	// own whose wait_timeout is HoldTimeout: a paused or cut-off relay's claim must
	// not hold its rows for the server's default eight hours.
	conn, err := d.db.Conn(context.WithoutCancel(ctx))
	if err != nil {
		return nil, interpretError(err)
	}
	c := &claim{d: d, conn: conn, bounded: p.HoldTimeout > 0}
	if c.bounded {
		if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = ?", seconds(p.HoldTimeout)); err != nil {
			c.end()
			return nil, interpretError(err)
		}
	}
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		c.end()
		return nil, interpretError(err)
	}
	c.tx = tx
	// The claim fence, shared, for the transaction's life: the next leader waits for
	// it (AcquireLeadership) rather than claim past the rows this claim locks.
	if err := d.fence(ctx, tx, "LOCK IN SHARE MODE"); err != nil {
		_ = c.Release(ctx)
		return nil, interpretError(err)
	}
	c.rows, err = outboxdriver.ClaimHeads(ctx, p, outboxdriver.ClaimQueries{
		Candidates: func(ctx context.Context, q *outboxdriver.ClaimParams, after int64, ahead []int64) ([]outboxdriver.Candidate, error) {
			return d.candidates(ctx, tx, q, after, ahead)
		},
		Lock: func(ctx context.Context, seqs []int64) ([]outboxdriver.Row, error) { return d.lockRows(ctx, tx, seqs) },
	})
	if err != nil {
		_ = c.Release(ctx)
		return nil, interpretError(err)
	}
	if len(c.rows) == 0 {
		if err := c.Release(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// candidates reads a claim's candidates (outboxdriver.ClaimQueries): due rows, not
// behind a failing row of their aggregate, not held by a dead letter, read without
// locking (a consistent read, whoever holds them).
func (d *Driver) candidates(ctx context.Context, tx *sql.Tx, p *outboxdriver.ClaimParams, after int64, ahead []int64) ([]outboxdriver.Candidate, error) {
	var where strings.Builder
	args := []any{after}
	if len(ahead) > 0 {
		where.WriteString("\n  AND o.seq NOT IN (" + sqlstore.Placeholders(len(ahead)) + ")")
		for _, s := range ahead {
			args = append(args, s)
		}
	}
	if len(p.Skip) > 0 {
		where.WriteString("\n  AND " + sqlrules.SkipSQL(len(p.Skip)))
		args = append(args, sqlrules.SkipArgs(p.Skip)...)
	}
	rows, err := tx.QueryContext(ctx, `SELECT o.seq, o.aggregatetype, o.aggregateid, COALESCE(LENGTH(o.payload), 0)
FROM `+d.q+` AS o
WHERE o.published_at IS NULL AND (o.available_at IS NULL OR o.available_at <= UTC_TIMESTAMP(6)) AND o.seq > ?
  AND `+sqlrules.NotBehindFailingSQL(d.q)+`
  AND `+sqlrules.NotHeldSQL(d.qDead)+where.String()+`
ORDER BY o.seq LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return outboxdriver.ScanCandidates(rows.Next, rows.Scan, rows.Err)
}

// lockRows locks and reads the candidates of seqs no other session holds.
func (d *Driver) lockRows(ctx context.Context, tx *sql.Tx, seqs []int64) ([]outboxdriver.Row, error) {
	args := make([]any, len(seqs))
	for i, s := range seqs {
		args[i] = s
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+rowColumns+` FROM `+d.q+`
WHERE seq IN (`+sqlstore.Placeholders(len(seqs))+`) AND published_at IS NULL ORDER BY seq FOR UPDATE SKIP LOCKED`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]outboxdriver.Row, 0, len(seqs))
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func seconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

type claim struct {
	d       *Driver
	conn    *sql.Conn
	bounded bool // the session's wait_timeout was set: reset it before the pool has it back
	tx      *sql.Tx
	rows    []outboxdriver.Row
}

// end gives the claim's session back to the pool, with the server's wait_timeout.
func (c *claim) end() {
	if c.conn == nil {
		return
	}
	if c.bounded {
		_, _ = c.conn.ExecContext(context.Background(), "SET SESSION wait_timeout = DEFAULT")
	}
	_ = c.conn.Close()
	c.conn = nil
}

func (c *claim) Rows() []outboxdriver.Row { return c.rows }

// KeepAlive implements outboxdriver.ClaimKeeper: a statement resets the session's
// wait_timeout clock.
func (c *claim) KeepAlive(ctx context.Context) error {
	if c.tx == nil {
		return nil
	}
	_, err := c.tx.ExecContext(ctx, "DO 1")
	return interpretError(err)
}

// Complete implements outboxdriver.Claim. When the claim's transaction cannot
// complete (the session's wait_timeout ended it, a cut connection, or one of its
// statements failed), what the broker acknowledged is still marked, in fresh
// transactions (outboxdriver.Settle).
func (c *claim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if c.tx == nil {
		return nil
	}
	if p.Completion == outboxdriver.CompleteArchive && len(p.Published) > 0 {
		_ = c.Release(ctx)
		return fmt.Errorf("archive completion: %w", outboxdriver.ErrNotSupported)
	}
	tx := c.tx
	c.tx = nil
	err := c.write(ctx, tx, p)
	if err == nil {
		err = sqltx.Commit(ctx, tx)
	} else {
		_ = tx.Rollback()
	}
	c.end()
	if err == nil || ctx.Err() != nil {
		return interpretError(err)
	}
	settle := func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		return c.settleTx(ctx, p, len(p.Failed) > 0)
	}
	if serr := outboxdriver.Settle(ctx, p, settle); serr != nil {
		return fmt.Errorf("%w (settling in a fresh transaction: %w)", interpretError(err), interpretError(serr))
	}
	return interpretError(sqlstore.Unpublished(ctx, &c.d.base, p.Published))
}

// Settle implements outboxdriver.Settler: the rows Complete left out, written in
// fresh transactions under the claim fence, shared (the caller's claims skip their
// aggregates meanwhile).
func (c *claim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	return interpretError(outboxdriver.Settle(ctx, p, func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		return c.settleTx(ctx, p, false)
	}))
}

// settleTx applies p, restricted to the rows it may still touch
// (outboxdriver.CompleteParams.Restrict), in a transaction of its own. It holds the
// claim fence: shared, or exclusive (a while at most) to record failures beside
// claims that may not skip them, so no other claim can pass the failing rows it
// locks.
func (c *claim) settleTx(ctx context.Context, p *outboxdriver.CompleteParams, exclusive bool) error {
	conn, err := c.d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	mode := "LOCK IN SHARE MODE"
	if exclusive {
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 2"); err != nil {
			return err
		}
		defer func() {
			_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION innodb_lock_wait_timeout = DEFAULT")
		}()
		mode = "FOR UPDATE"
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := c.d.fence(ctx, tx, mode); err != nil {
		return err
	}
	ids := p.IDs()
	rows, err := tx.QueryContext(ctx, `SELECT id, attempts FROM `+c.d.q+` WHERE id IN (`+sqlstore.Placeholders(len(ids))+`)
  AND published_at IS NULL FOR UPDATE SKIP LOCKED`, sqlstore.Args(ids)...)
	if err != nil {
		return err
	}
	now, err := sqlrules.ScanAttempts(rows.Next, rows.Scan, rows.Err)
	rows.Close()
	if err != nil {
		return err
	}
	if err := c.write(ctx, tx, p.Restrict(c.rows, now)); err != nil {
		return err
	}
	return sqltx.Commit(ctx, tx)
}

var _ outboxdriver.Completer = (*Driver)(nil)

// write applies p in tx: marks (or deletes) the published rows, and records the
// failures.
func (c *claim) write(ctx context.Context, tx *sql.Tx, p *outboxdriver.CompleteParams) error {
	return sqlstore.WriteOutcomes(ctx, &c.d.base, tx, p)
}

func (c *claim) Release(context.Context) error {
	defer c.end()
	if c.tx == nil {
		return nil
	}
	tx := c.tx
	c.tx = nil
	return interpretError(tx.Rollback())
}

// AcquireLeadership implements outboxdriver.Store with GET_LOCK on a dedicated
// session: the lock ends with the session. With params.Timeout the session runs with
// that wait_timeout (whole seconds, rounded up): the server closes it, and frees the
// lock, when the relay stops proving it is alive.
func (d *Driver) AcquireLeadership(ctx context.Context, params *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, interpretError(err)
	}
	if params != nil && params.Timeout > 0 {
		secs := int64((params.Timeout + time.Second - 1) / time.Second)
		if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = ?", secs); err != nil {
			_ = conn.Close()
			return nil, interpretError(err)
		}
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", d.lock).Scan(&got); err != nil {
		_ = conn.Close()
		return nil, interpretError(err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, conn.Close()
	}
	// The previous leader's claims can outlive its lock's session: wait until none
	// holds the claim fence, or this relay would claim past the rows they lock and
	// publish an aggregate's later events first. They end by their HoldTimeout.
	if err := d.waitForClaims(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("waiting for the previous leader's claims to end: %w", interpretError(err))
	}
	return &leadership{d: d, conn: conn}, nil
}

// waitForClaims takes the claim fence exclusively, once every claim holding it has
// ended, and gives it back.
func (d *Driver) waitForClaims(ctx context.Context, conn *sql.Conn) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := d.fence(ctx, tx, "FOR UPDATE"); err != nil {
		_ = tx.Rollback()
		return err
	}
	return sqltx.Commit(ctx, tx)
}

// fence locks the claim fence in mode. A table made before the migrations table (or
// by hand, without it) has no fence: it relays as before rather than not at all.
func (d *Driver) fence(ctx context.Context, tx *sql.Tx, mode string) error {
	var v int64
	err := tx.QueryRowContext(ctx, `SELECT version FROM `+d.versions+` ORDER BY version LIMIT 1 `+mode).Scan(&v)
	var me *mysql.MySQLError
	if errors.Is(err, sql.ErrNoRows) || errors.As(err, &me) && me.Number == 1146 {
		return nil
	}
	return err
}

type leadership struct {
	d    *Driver
	conn *sql.Conn
}

func (l *leadership) Check(ctx context.Context) error {
	if l.conn == nil {
		return outboxdriver.ErrLeadershipLost
	}
	if err := l.conn.PingContext(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %v", outboxdriver.ErrLeadershipLost, err) //nolint:errorlint // leadership is lost, whatever cut the connection: one sentinel to branch on
	}
	return nil
}

func (l *leadership) Release(ctx context.Context) error {
	if l.conn == nil {
		return nil
	}
	conn := l.conn
	l.conn = nil
	_, _ = conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", l.d.lock)
	// Discard the session rather than pool it.
	err := conn.Raw(func(any) error { return driver.ErrBadConn })
	if errors.Is(err, driver.ErrBadConn) {
		return nil
	}
	return err
}

// Listen implements outboxdriver.Store: not supported; the relay polls.
func (d *Driver) Listen(context.Context) (outboxdriver.Listener, error) {
	return nil, outboxdriver.ErrNotSupported
}

// Status implements outboxdriver.Store.
func (d *Driver) Status(ctx context.Context) (*outboxdriver.Status, error) {
	st, err := sqlstore.Status(ctx, &d.base)
	if err != nil {
		return nil, err
	}
	var holder sql.NullInt64
	if err := d.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", d.lock).Scan(&holder); err != nil {
		return nil, interpretError(err)
	}
	if holder.Valid {
		st.ActiveRelay = fmt.Sprintf("connection %d", holder.Int64)
	}
	return st, nil
}

// Cleanup implements outboxdriver.Store.
func (d *Driver) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (int64, error) {
	res, err := d.db.ExecContext(ctx, `DELETE FROM `+d.q+` WHERE published_at IS NOT NULL AND published_at < ? ORDER BY seq LIMIT ?`,
		utc(p.Before), p.Limit)
	if err != nil {
		return 0, interpretError(err)
	}
	return res.RowsAffected()
}

// ListDead implements outboxdriver.Store.
func (d *Driver) ListDead(ctx context.Context, f *outboxdriver.DeadFilter) ([]outboxdriver.DeadLetter, error) {
	where, args := sqlstore.DeadWhere(&d.base, f)
	rows, err := d.db.QueryContext(ctx, `SELECT `+rowColumns+`, error, `+dialect.Column("dead_at")+`, holds_key FROM `+d.qDead+where, args...)
	if err != nil {
		return nil, interpretError(err)
	}
	defer rows.Close()
	var out []outboxdriver.DeadLetter
	for rows.Next() {
		var dl outboxdriver.DeadLetter
		deadAt := &textTime{}
		r, err := scanRow(rows, &dl.Error, deadAt, &dl.HoldsKey)
		if err != nil {
			return nil, interpretError(err)
		}
		dl.Row = r
		dl.DeadAt, _ = deadAt.Time()
		if f != nil {
			dl.CutPayload(f.PayloadMax)
		}
		out = append(out, dl)
	}
	return out, interpretError(rows.Err())
}

// migrator applies the table's migrations (SQL and Schema are the Set's).
type migrator struct {
	migrations.Set
	d *Driver
}

func newMigrator(d *Driver) migrator {
	m := migrator{d: d}
	m.Set = migrations.Set{DB: d.db, Title: "outbox schema for " + d.table.Name + " (MySQL/MariaDB)", Versions: d.versions,
		Create: "CREATE TABLE IF NOT EXISTS " + d.versions + " (version INT PRIMARY KEY, applied_at DATETIME(6) NOT NULL)",
		Record: "INSERT IGNORE INTO " + d.versions + " (version, applied_at) VALUES (%d, UTC_TIMESTAMP(6))",
		Load:   m.migrations, Interpret: interpretError}
	return m
}

func (m migrator) migrations() ([]migrations.Migration, error) {
	t := m.d.table
	return migrations.Load(migrationFS, map[string]string{
		"Table":            m.d.q,
		"DeadTable":        m.d.qDead,
		"IDIndex":          quote(t.Derived("_id")),
		"UnpublishedIndex": quote(t.Derived("_unpublished_idx")),
		"FailingIndex":     quote(t.Derived("_failing_idx")),
		"DeadHoldIndex":    quote(t.Derived("_dead_holds_idx")),
	})
}

// Migrate implements outboxdriver.Migrator. MySQL commits DDL at once, so each step
// is idempotent (IF NOT EXISTS) and concurrent migrators queue on a named lock.
func (m migrator) Migrate(ctx context.Context) ([]int, error) {
	if m.d.db == nil {
		return nil, outboxdriver.ErrNoPool
	}
	ms, err := m.Load()
	if err != nil {
		return nil, err
	}
	conn, err := m.d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", m.d.lock+":migrate").Scan(&got); err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	if got.Int64 != 1 {
		return nil, errors.New("migration lock: not granted within 60 s (another migration holds it)")
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", m.d.lock+":migrate")
	}()
	if _, err := conn.ExecContext(ctx, m.Create); err != nil {
		return nil, err
	}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM "+m.Versions)
	if err != nil {
		return nil, err
	}
	done, err := migrations.Versions(rows)
	rows.Close()
	if err != nil {
		return nil, err
	}
	// DDL commits on its own in MySQL: statement by statement, recorded after each step.
	return migrations.Apply(ms, done, func(mg migrations.Migration) error {
		for _, stmt := range strings.Split(stripComments(mg.SQL), ";") {
			if strings.TrimSpace(stmt) == "" {
				continue
			}
			if _, err := conn.ExecContext(ctx, stmt); err != nil && !duplicateIndex(err) {
				return err
			}
		}
		return nil
	}, func(v int) error {
		_, err := conn.ExecContext(ctx, "INSERT INTO "+m.Versions+" (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))", v)
		return err
	})
}

// duplicateIndex reports MySQL's "duplicate key name" (1061): MySQL 8 has no CREATE
// INDEX IF NOT EXISTS, so an index a step made before its version was recorded is
// there already, as the step wants.
func duplicateIndex(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1061
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
