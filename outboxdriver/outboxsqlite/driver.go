// Package outboxsqlite is the outbox driver for SQLite through modernc.org/sqlite
// (pure Go, no cgo): the embedded default.
//
//	db, _ := outboxsqlite.Open("app.db") // WAL mode, busy timeout, immediate transactions
//	w, _ := outbox.NewWriter(outboxsqlite.New(db, nil), nil)
//	tx, _ := db.BeginTx(ctx, nil)
//	w.WriteTx(ctx, tx, event) // in the same transaction as the business change
//
// SQLite has one writer at a time, so one relay at a time: leadership is a lease row
// the active relay renews. Claims take no lock (there is nothing to skip); the store
// keeps the rows of claims still in flight out of later claims instead. Write order
// is commit order, since write transactions never overlap.
package outboxsqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/outboxd/outbox/internal/simbug"
	"github.com/outboxd/outbox/internal/sqlrules"
	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/migrations"
	"github.com/outboxd/outbox/outboxdriver/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// LeaseTTLDefault is how long a relay's leadership lasts without renewal. A standby
// takes over at most this long after the active relay dies.
const LeaseTTLDefault = 5 * time.Second

// Open opens path with the settings the outbox needs: WAL journal (readers do not
// block the writer), a busy timeout, and transactions that take the write lock at
// BEGIN (no deadlock when two transactions both want to write).
func Open(path string) (*sql.DB, error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	if err := db.Ping(); err != nil { //nolint:noctx // Open takes no context, as sql.Open does: a local file has nothing to wait for
		_ = db.Close()
		return nil, fmt.Errorf("open SQLite database %s: %w", path, err)
	}
	return db, nil
}

// Options configure the driver. Nil means the defaults.
type Options struct {
	// Table is the outbox table; its Schema must be empty or "main".
	Table outboxdriver.Table
	// LeaseTTL is the relay leadership lease. Default LeaseTTLDefault.
	LeaseTTL time.Duration
	// Clock is the wall clock the lease, retries and marks are written and judged by;
	// nil: time.Now. The lease is a wall-clock time shared by every process on the
	// file, so a clock stepped forward takes over a lease early (a simulation steps
	// it: docs/testing.md).
	Clock func() time.Time
}

// Driver binds outbox to a SQLite *sql.DB. Build it with New. It is an
// outboxdriver.Driver[*sql.Tx] (Table, Err, GetExecutor, UnwrapExecutor, Store and
// Migrator, written once for MySQL and SQLite, are not listed below), and its Store
// is the Driver itself: an outboxdriver.Store, Admin (with Event, RetryNow,
// ReplayDead, PurgeDead and EditDead) and Completer (CompletePublished).
type Driver struct {
	base  // the methods written once for MySQL and SQLite
	db    *sql.DB
	table outboxdriver.Table
	ttl   time.Duration
	clock func() time.Time
	q     string // quoted table
	qLead string // quoted leader table
	qDead string // quoted dead-letter table

	// In-process wake-ups: SQLite has no LISTEN/NOTIFY, but a writer and a relay
	// sharing this driver still wake each other.
	mu        sync.Mutex
	listeners map[*listener]struct{}

	// Claims in flight, by the seqs of their rows, which later claims skip: the
	// rows themselves, as SKIP LOCKED skips locked rows. (Not their seq range: a row
	// inside it that was not claimable then, behind a failing row or of an aggregate
	// the claim skipped, must not be passed by its aggregate's later rows once it is.)
	claimMu  sync.Mutex
	inFlight map[*claim][]int64
}

// New returns a driver on db (opened with Open, or with the same settings).
func New(db *sql.DB, opts *Options) *Driver {
	var o Options
	if opts != nil {
		o = *opts
	}
	t := o.Table
	if t.Schema == "" {
		t.Schema = "main"
	}
	t = t.WithDefaults()
	d := &Driver{db: db, table: t, ttl: o.LeaseTTL, clock: o.Clock, listeners: map[*listener]struct{}{}, inFlight: map[*claim][]int64{}}
	if d.clock == nil {
		d.clock = time.Now
	}
	if d.ttl <= 0 {
		d.ttl = LeaseTTLDefault
	}
	err := t.ValidatePortable()
	if t.Schema != "main" {
		err = fmt.Errorf("%w: SQLite tables have no schema (got %q)", outboxdriver.ErrInvalidIdentifier, t.Schema)
	}
	d.q = quote(t.Name)
	d.qLead = quote(t.Derived("_leader"))
	d.qDead = quote(t.Derived("_dead"))
	d.base = sqlstore.NewBase(db, t, err, d.q, d.qDead, d.dialect(), sqlstore.Parts{Store: d, Migrator: newMigrator(d), Notify: d.notify})
	return d
}

// quote quotes an identifier already checked against outboxdriver's strict pattern.
func quote(id string) string { return `"` + strings.ReplaceAll(id, `"`, `""`) + `"` }

// base is the part written once for MySQL and SQLite (an alias: the field stays
// unexported).
type base = sqlstore.Base

// dialect is SQLite's: times are Unix milliseconds of the driver's clock
// (Options.Clock), id lists one JSON argument (no bound-variable limit).
func (d *Driver) dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		Now:         func() (string, []any) { return "?", []any{d.nowMillis()} },
		Clock:       d.clock,
		Time:        func(t time.Time) any { return t.UnixMilli() },
		Column:      func(expr string) string { return expr },
		NewTime:     func() sqlstore.TimeValue { return &milliTime{} },
		IDs:         func(ids []string) (string, []any) { return "(SELECT value FROM json_each(?))", []any{jsonIDs(ids)} },
		InsertChunk: 400, // well under SQLite's bound-variable limit
		DueNow:      int64(0),
		Interpret:   interpretError,
	}
}

// milliTime is a time column of Unix milliseconds.
type milliTime struct{ n sql.NullInt64 }

func (t *milliTime) Scan(src any) error { return t.n.Scan(src) }

func (t *milliTime) Time() (time.Time, bool) { return time.UnixMilli(t.n.Int64), t.n.Valid }

var (
	_ outboxdriver.Driver[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store           = (*Driver)(nil)
)

// Name implements outboxdriver.Driver.
func (d *Driver) Name() string { return "sqlite" }

// LeaseTTL is the relay leadership lease in force.
func (d *Driver) LeaseTTL() time.Duration { return d.ttl }

// interpretError translates SQLite errors to the outboxdriver sentinels.
func interpretError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "no such column"):
		return fmt.Errorf("%w: %s (run `outbox migrate`)", outboxdriver.ErrSchemaBehind, msg)
	case strings.Contains(msg, "no such table"):
		return fmt.Errorf("%w: %s", outboxdriver.ErrTableMissing, msg)
	case strings.Contains(msg, "UNIQUE constraint failed"):
		return fmt.Errorf("%w: %s", outboxdriver.ErrDuplicateID, msg)
	}
	return err
}

// notify wakes the relays listening on this driver: SQLite has no LISTEN/NOTIFY, but a
// writer and a relay sharing the driver still wake each other.
func (d *Driver) notify() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for l := range d.listeners {
		select {
		case l.ch <- struct{}{}:
		default:
		}
	}
}

// nowMillis is the driver's wall clock (Options.Clock) in Unix milliseconds.
func (d *Driver) nowMillis() int64 { return d.clock().UnixMilli() }

func notBehindFailing(q string) string {
	if simbug.On("sqlite-pass-failing") {
		return "true"
	}
	return sqlrules.NotBehindFailingSQL(q)
}

// Capabilities implements outboxdriver.Source: mark and delete completion, and
// wake-ups from writers in this process.
func (d *Driver) Capabilities() outboxdriver.Capabilities {
	c := outboxdriver.Basic()
	c.Listen, c.Split = true, true
	return c
}

// Claim implements outboxdriver.Store: the oldest unpublished rows not in a claim
// still in flight.
func (d *Driver) Claim(ctx context.Context, p *outboxdriver.ClaimParams) (outboxdriver.Claim, error) {
	if p.MaxSeq > 0 {
		return nil, fmt.Errorf("claim up to a seq: %w", outboxdriver.ErrNotSupported)
	}
	if len(p.Columns) > 0 {
		return nil, fmt.Errorf("claim with extra columns %v: %w", p.Columns, outboxdriver.ErrNotSupported)
	}
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	c := &claim{d: d}
	var err error
	c.rows, err = outboxdriver.ClaimHeads(ctx, p, outboxdriver.ClaimQueries{Candidates: d.candidates, Lock: d.lockRows})
	if err != nil {
		return nil, interpretError(err)
	}
	if len(c.rows) > 0 {
		seqs := make([]int64, len(c.rows))
		for i := range c.rows {
			seqs[i] = c.rows[i].Seq
		}
		d.inFlight[c] = seqs
	}
	return c, nil
}

// candidates reads a claim's candidates (outboxdriver.ClaimQueries), under claimMu:
// due rows, not behind a failing row of their aggregate, not held by a dead letter,
// whether another claim has them in flight or not (the head rule needs to see them).
func (d *Driver) candidates(ctx context.Context, p *outboxdriver.ClaimParams, after int64, ahead []int64) ([]outboxdriver.Candidate, error) {
	var where strings.Builder
	now := d.nowMillis()
	args := []any{now, after}
	if len(ahead) > 0 {
		b, _ := json.Marshal(ahead)
		where.WriteString(" AND seq NOT IN (SELECT value FROM json_each(?))")
		args = append(args, string(b))
	}
	if len(p.Skip) > 0 {
		where.WriteString(" AND " + sqlrules.SkipSQL(len(p.Skip)))
		args = append(args, sqlrules.SkipArgs(p.Skip)...)
	}
	rows, err := d.db.QueryContext(ctx, `SELECT seq, aggregatetype, aggregateid, coalesce(length(payload), 0)
FROM `+d.q+` AS o WHERE published_at IS NULL AND available_at <= ? AND seq > ?
  AND `+notBehindFailing(d.q)+`
  AND `+sqlrules.NotHeldSQL(d.qDead)+where.String()+` ORDER BY seq LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return outboxdriver.ScanCandidates(rows.Next, rows.Scan, rows.Err)
}

// lockRows reads the rows of seqs still unpublished that no other claim of this
// process has in flight (SQLite's stand-in for row locks), under claimMu.
func (d *Driver) lockRows(ctx context.Context, seqs []int64) ([]outboxdriver.Row, error) {
	busy := map[int64]bool{}
	for _, c := range d.inFlight {
		for _, s := range c {
			busy[s] = true
		}
	}
	free := make([]int64, 0, len(seqs))
	for _, s := range seqs {
		if !busy[s] {
			free = append(free, s)
		}
	}
	if len(free) == 0 {
		return nil, nil
	}
	b, _ := json.Marshal(free)
	rows, err := d.db.QueryContext(ctx, `SELECT `+sqlstore.RowColumns(d.dialect())+`
FROM `+d.q+` WHERE seq IN (SELECT value FROM json_each(?)) AND published_at IS NULL ORDER BY seq`, string(b))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]outboxdriver.Row, 0, len(free))
	for rows.Next() {
		r, err := sqlstore.ScanRow(rows, d.dialect())
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

type claim struct {
	d    *Driver
	rows []outboxdriver.Row
	done bool
}

func (c *claim) Rows() []outboxdriver.Row { return c.rows }

func (c *claim) finish() {
	c.d.claimMu.Lock()
	delete(c.d.inFlight, c)
	c.d.claimMu.Unlock()
	c.done = true
}

func jsonIDs(ids []string) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

func (c *claim) Complete(ctx context.Context, p *outboxdriver.CompleteParams) error {
	if c.done {
		return nil
	}
	defer c.finish()
	if p.Completion == outboxdriver.CompleteArchive && len(p.Published) > 0 {
		return fmt.Errorf("archive completion: %w", outboxdriver.ErrNotSupported)
	}
	tx, err := c.d.db.BeginTx(ctx, nil)
	if err != nil {
		return interpretError(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := c.write(ctx, tx, p); err != nil {
		return interpretError(err)
	}
	return interpretError(tx.Commit())
}

// Settle implements outboxdriver.Settler: the rows Complete left out, written in a
// transaction of their own, restricted to those still unpublished with the attempts
// claimed.
func (c *claim) Settle(ctx context.Context, p *outboxdriver.CompleteParams) error {
	return interpretError(outboxdriver.Settle(ctx, p, func(ctx context.Context, p *outboxdriver.CompleteParams) error {
		tx, err := c.d.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		rows, err := tx.QueryContext(ctx, `SELECT id, attempts FROM `+c.d.q+` WHERE id IN (SELECT value FROM json_each(?)) AND published_at IS NULL`, jsonIDs(p.IDs()))
		if err != nil {
			return err
		}
		now, err := sqlrules.ScanAttempts(rows.Next, rows.Scan, rows.Err)
		_ = rows.Close()
		if err != nil {
			return err
		}
		if err := c.write(ctx, tx, p.Restrict(c.rows, now)); err != nil {
			return err
		}
		return tx.Commit()
	}))
}

var _ outboxdriver.Completer = (*Driver)(nil)

// write applies p in tx: marks (or deletes) the published rows, and records the
// failures.
func (c *claim) write(ctx context.Context, tx *sql.Tx, p *outboxdriver.CompleteParams) error {
	return sqlstore.WriteOutcomes(ctx, &c.d.base, tx, p)
}

func (c *claim) Release(context.Context) error {
	if !c.done {
		c.finish()
	}
	return nil
}

// AcquireLeadership implements outboxdriver.Store with a lease row. The lease lasts
// Options.LeaseTTL whatever params say: it already expires by itself when the relay
// stops renewing it.
func (d *Driver) AcquireLeadership(ctx context.Context, _ *outboxdriver.LeadershipParams) (outboxdriver.Leadership, error) {
	holder := make([]byte, 8)
	_, _ = rand.Read(holder)
	l := &lease{d: d, holder: hex.EncodeToString(holder)}
	now := d.nowMillis()
	res, err := d.db.ExecContext(ctx, `INSERT INTO `+d.qLead+` (name, holder, expires_at) VALUES ('relay', ?, ?)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at WHERE expires_at < ?`,
		l.holder, now+d.ttl.Milliseconds(), now)
	if err != nil {
		return nil, interpretError(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return nil, nil
	}
	// Claims exclude each other in this process only (SQLite has no row locks): a
	// claim of this process's previous term still in flight would make this one
	// claim past its rows, so wait for it to end.
	for {
		d.claimMu.Lock()
		n := len(d.inFlight)
		d.claimMu.Unlock()
		if n == 0 {
			return l, nil
		}
		select {
		case <-ctx.Done():
			_ = l.Release(context.WithoutCancel(ctx))
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

type lease struct {
	d        *Driver
	holder   string
	released bool
}

// Check renews the lease; it is lost if another relay took it after it expired.
func (l *lease) Check(ctx context.Context) error {
	if l.released {
		return outboxdriver.ErrLeadershipLost
	}
	res, err := l.d.db.ExecContext(ctx, `UPDATE `+l.d.qLead+` SET expires_at = ? WHERE name = 'relay' AND holder = ?`,
		l.d.nowMillis()+l.d.ttl.Milliseconds(), l.holder)
	if err != nil {
		return fmt.Errorf("%w: %v", outboxdriver.ErrLeadershipLost, err) //nolint:errorlint // leadership is lost, whatever cut the connection: one sentinel to branch on
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return outboxdriver.ErrLeadershipLost
	}
	return nil
}

// Bound implements outboxdriver.LeaseBound: the lease TTL.
func (l *lease) Bound() time.Duration { return l.d.ttl }

func (l *lease) Release(ctx context.Context) error {
	if l.released {
		return nil
	}
	l.released = true
	_, err := l.d.db.ExecContext(ctx, `DELETE FROM `+l.d.qLead+` WHERE name = 'relay' AND holder = ?`, l.holder)
	return interpretError(err)
}

// Listen implements outboxdriver.Store with in-process wake-ups from writers that
// share this driver.
func (d *Driver) Listen(context.Context) (outboxdriver.Listener, error) {
	l := &listener{d: d, ch: make(chan struct{}, 1)}
	d.mu.Lock()
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	return l, nil
}

type listener struct {
	d  *Driver
	ch chan struct{}
}

func (l *listener) Wait(ctx context.Context) error {
	select {
	case <-l.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *listener) Close(context.Context) error {
	l.d.mu.Lock()
	delete(l.d.listeners, l)
	l.d.mu.Unlock()
	return nil
}

// Status implements outboxdriver.Store.
func (d *Driver) Status(ctx context.Context) (*outboxdriver.Status, error) {
	st, err := sqlstore.Status(ctx, &d.base)
	if err != nil {
		return nil, err
	}
	var holder string
	var expires int64
	err = d.db.QueryRowContext(ctx, `SELECT holder, expires_at FROM `+d.qLead+` WHERE name = 'relay' AND expires_at >= ?`, d.nowMillis()).Scan(&holder, &expires)
	switch {
	case err == nil:
		st.ActiveRelay = "lease holder " + holder + ", lease until " + time.UnixMilli(expires).UTC().Format(time.RFC3339)
	case !errors.Is(err, sql.ErrNoRows):
		return nil, interpretError(err)
	}
	return st, nil
}

// migrator applies the table's migrations (SQL and Schema are the Set's).
type migrator struct {
	migrations.Set
	d *Driver
}

func newMigrator(d *Driver) migrator {
	m := migrator{d: d}
	versions := quote(d.table.Derived("_migrations"))
	m.Set = migrations.Set{DB: d.db, Title: "outbox schema for " + d.table.Name + " (SQLite)", Versions: versions,
		Create: "CREATE TABLE IF NOT EXISTS " + versions + " (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
		Record: "INSERT OR IGNORE INTO " + versions + " (version, applied_at) VALUES (%d, 0)",
		Load:   m.migrations, Interpret: interpretError}
	return m
}

func (m migrator) migrations() ([]migrations.Migration, error) {
	return migrations.Load(migrationFS, map[string]string{
		"Table":            m.d.q,
		"UnpublishedIndex": quote(m.d.table.Derived("_unpublished_idx")),
		"LeaderTable":      m.d.qLead,
		"FailingIndex":     quote(m.d.table.Derived("_failing_idx")),
		"DeadTable":        m.d.qDead,
		"DeadHoldIndex":    quote(m.d.table.Derived("_dead_holds_idx")),
		"CleanupIndex":     quote(m.d.table.Derived("_cleanup_idx")),
	})
}

// Migrate applies pending migrations in one immediate (write-locked) transaction.
func (m migrator) Migrate(ctx context.Context) (applied []int, err error) {
	if m.d.db == nil {
		return nil, outboxdriver.ErrNoPool
	}
	ms, err := m.Load()
	if err != nil {
		return nil, err
	}
	tx, err := m.d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, m.Create); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, "SELECT version FROM "+m.Versions)
	if err != nil {
		return nil, err
	}
	done, err := migrations.Versions(rows)
	rows.Close()
	if err != nil {
		return nil, err
	}
	applied, err = migrations.Apply(ms, done, func(mg migrations.Migration) error {
		_, err := tx.ExecContext(ctx, mg.SQL)
		return err
	}, func(v int) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+m.Versions+" (version, applied_at) VALUES (?, ?)", v, m.d.nowMillis())
		return err
	})
	if err != nil {
		return nil, err
	}
	return applied, tx.Commit()
}

// Cleanup implements outboxdriver.Store.
func (d *Driver) Cleanup(ctx context.Context, p *outboxdriver.CleanupParams) (int64, error) {
	res, err := d.db.ExecContext(ctx, `DELETE FROM `+d.q+` WHERE seq IN (
  SELECT seq FROM `+d.q+` WHERE published_at IS NOT NULL AND published_at < ? ORDER BY published_at LIMIT ?)`, p.Before.UnixMilli(), p.Limit)
	if err != nil {
		return 0, interpretError(err)
	}
	return res.RowsAffected()
}
