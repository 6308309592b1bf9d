// Package outboxsql is the outbox driver for PostgreSQL through database/sql with the
// pgx stdlib driver (`import _ "github.com/jackc/pgx/v5/stdlib"`, driver name "pgx").
//
//	db, _ := sql.Open("pgx", "postgres://...")
//	w, _ := outbox.NewWriter(outboxsql.New(db, nil), nil)
//	tx, _ := db.BeginTx(ctx, nil)
//	w.WriteTx(ctx, tx, event) // in the same transaction as the business change
//
// database/sql cannot LISTEN, so a relay on this driver relies on its poll interval;
// the writer's notifications still wake relays that run on outboxpgx.
package outboxsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/outboxd/outbox/outboxdriver"
	"github.com/outboxd/outbox/outboxdriver/internal/pgsql"
	"github.com/outboxd/outbox/outboxdriver/internal/sqltx"
)

// Driver binds outbox to a *sql.DB. Build it with New.
type Driver struct {
	db    *sql.DB
	table outboxdriver.Table
	s     *pgsql.Statements
	err   error
}

// New returns a driver on db (nil is allowed for a writer that only uses WriteTx).
// A nil table means outboxdriver's defaults.
func New(db *sql.DB, table *outboxdriver.Table) *Driver {
	var t outboxdriver.Table
	if table != nil {
		t = *table
	}
	s, err := pgsql.NewStatements(t)
	return &Driver{db: db, table: t.WithDefaults(), s: s, err: err}
}

var _ outboxdriver.Driver[*sql.Tx] = (*Driver)(nil)

// Name implements outboxdriver.Driver.
func (d *Driver) Name() string { return "database/sql" }

// Table implements outboxdriver.Driver.
func (d *Driver) Table() outboxdriver.Table { return d.table }

// Err implements outboxdriver.Driver.
func (d *Driver) Err() error { return d.err }

// UnwrapExecutor implements outboxdriver.Driver.
func (d *Driver) UnwrapExecutor(tx *sql.Tx) outboxdriver.Executor {
	return pgsql.Executor{Statements: d.s, Querier: querier{tx}}
}

// GetExecutor implements outboxdriver.Driver.
func (d *Driver) GetExecutor() (outboxdriver.Executor, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	return pgsql.Executor{Statements: d.s, Querier: querier{d.db}}, nil
}

// Store implements outboxdriver.Driver.
func (d *Driver) Store() (outboxdriver.Store, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	return &pgsql.Store{Statements: d.s, DB: db{d.db}}, nil
}

// Migrator implements outboxdriver.Driver. Without a pool its SQL method still
// works, for `outbox migrate --print`.
func (d *Driver) Migrator() (outboxdriver.Migrator, error) {
	if d.err != nil {
		return nil, d.err
	}
	if d.db == nil {
		return &pgsql.Migrator{Statements: d.s}, nil
	}
	return &pgsql.Migrator{Statements: d.s, DB: db{d.db}}, nil
}

func (d *Driver) check() error {
	if d.err != nil {
		return d.err
	}
	if d.db == nil {
		return outboxdriver.ErrNoPool
	}
	return nil
}

// sqlQuerier is what *sql.DB, *sql.Tx and *sql.Conn share.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type querier struct{ q sqlQuerier }

func (q querier) Exec(ctx context.Context, query string, args ...any) error {
	_, err := q.q.ExecContext(ctx, query, args...)
	return err
}

func (q querier) Query(ctx context.Context, query string, args ...any) (pgsql.Rows, error) {
	rows, err := q.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

type db struct{ db *sql.DB }

func (d db) Exec(ctx context.Context, query string, args ...any) error {
	return querier{d.db}.Exec(ctx, query, args...)
}

func (d db) Query(ctx context.Context, query string, args ...any) (pgsql.Rows, error) {
	return querier{d.db}.Query(ctx, query, args...)
}

// Begin starts a transaction whose life is its Commit or Rollback, not ctx's:
// database/sql rolls a transaction back when the context it began with ends, and a
// claim's transaction outlives the call that claimed (the relay bounds each call with
// a deadline). Every statement still runs under its own ctx.
func (d db) Begin(ctx context.Context) (pgsql.Tx, error) {
	tx, err := d.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return nil, err
	}
	return txAdapter{querier{tx}, tx}, nil
}

func (d db) Conn(ctx context.Context) (pgsql.Conn, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return &conn{querier{c}, c}, nil
}

type txAdapter struct {
	querier
	tx *sql.Tx
}

func (t txAdapter) Commit(ctx context.Context) error { return sqltx.Commit(ctx, t.tx) }
func (t txAdapter) Rollback(context.Context) error   { return t.tx.Rollback() }

type conn struct {
	querier
	c *sql.Conn
}

// Close ends the session so that its advisory locks end with it: database/sql would
// otherwise keep it, lock and all, in its idle pool.
func (c *conn) Close() error {
	// Returning ErrBadConn from Raw makes database/sql close the session and
	// release the *sql.Conn.
	err := c.c.Raw(func(any) error { return driver.ErrBadConn })
	if errors.Is(err, driver.ErrBadConn) {
		return nil
	}
	return err
}
